"""Modeling: the task-independent model side of a run: load a model, config and processor (Hub id, folder, or built
from a config), the task mapping (``modeling.tasks``, where the task registry lands), label maps, parameter counts."""

from leantrain.modeling.load import (PACKAGED_MODEL, build_model, inspect_model, load_config, load_processor,
                                     load_tokenizer, model_name, packaged_model_path, parameter_counts, resolve_task,
                                     trained_label_names)

__all__ = ["PACKAGED_MODEL", "build_model", "inspect_model", "load_config", "load_processor", "load_tokenizer",
           "model_name", "packaged_model_path", "parameter_counts", "resolve_task", "trained_label_names"]
