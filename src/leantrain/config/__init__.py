"""Typed, strict config: defaults < YAML file < key=value overrides (dotted keys).

Every section is a pydantic model with ``extra="forbid"``: a misspelled key fails with a "did you mean" hint,
a bad value names the key and the type it expects. ``resolve()`` is the one entry point.
"""


from leantrain.config.read import describe_keys, known_keys, load_yaml, parse_override, resolve
from leantrain.config.model_data import DataConfig, ModelConfig
from leantrain.config.run_options import CheckpointConfig, DistributedConfig, EfficiencyConfig, PeftConfig, ReportConfig
from leantrain.config.base import Section
from leantrain.config.sections import Config
from leantrain.config.training import OptimConfig, TrainConfig, largest_divisor, parse_stop_when

__all__ = ["CheckpointConfig", "Config", "DataConfig", "DistributedConfig", "EfficiencyConfig", "ModelConfig",
           "OptimConfig", "PeftConfig", "ReportConfig", "Section", "TrainConfig", "describe_keys", "known_keys",
           "largest_divisor", "load_yaml", "parse_override", "parse_stop_when", "resolve"]
