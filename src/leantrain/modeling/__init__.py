"""Modeling: load or build a model, config and processor for a method (``leantrain.methods``), and generate
(``generation``)."""

from leantrain.modeling.load import (PACKAGED_MODEL, WEIGHTS_DTYPE, build_model, flop_parameters, inspect_model,
                                     load_config, load_processor, load_tokenizer, load_trained_model, model_name,
                                     packaged_model_path, parameter_counts, trained_label_names)

__all__ = ["PACKAGED_MODEL", "WEIGHTS_DTYPE", "build_model", "flop_parameters", "inspect_model", "load_config",
           "load_processor", "load_tokenizer", "load_trained_model", "model_name", "packaged_model_path",
           "parameter_counts", "trained_label_names"]
