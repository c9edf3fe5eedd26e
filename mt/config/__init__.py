"""Typed, frozen, strict run configuration: YAML file + `--set a.b=value` overrides.

Every section rejects unknown keys (naming the nearest valid one) and wrong types, so a typo
can never silently fall back to a default."""

from mt.config.data import DataConfig, TokenizerConfig
from mt.config.decode import MAX_BEAM, DecodeConfig
from mt.config.load import (
    apply_overrides,
    builtin_configs,
    config_from_dict,
    describe_config,
    diff_configs,
    find_config,
    load_config,
    parse_override,
    save_config,
    validate,
    with_fixed,
)
from mt.config.model import ModelConfig
from mt.config.schema import Config
from mt.config.train import ScheduledSamplingConfig, TrainConfig

__all__ = [
    "MAX_BEAM",
    "Config",
    "DataConfig",
    "DecodeConfig",
    "ModelConfig",
    "ScheduledSamplingConfig",
    "TokenizerConfig",
    "TrainConfig",
    "apply_overrides",
    "builtin_configs",
    "config_from_dict",
    "describe_config",
    "diff_configs",
    "find_config",
    "load_config",
    "parse_override",
    "save_config",
    "validate",
    "with_fixed",
]
