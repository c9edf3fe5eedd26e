"""mt: train, run and score Transformer translation models from one YAML config."""

__version__ = "0.1.0"
