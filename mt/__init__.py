"""mt: train, run and score Transformer translation models from one YAML config."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The Python API, imported on first use so that `import mt` (and `mt --help`) stays light:
    # from mt import Translator, Sampling, DecodeOptions
    if name == "Translator":
        from mt.decode.translator import Translator

        return Translator
    if name == "Sampling":
        from mt.decode.sampling import Sampling

        return Sampling
    if name == "DecodeOptions":
        from mt.decode.options import DecodeOptions

        return DecodeOptions
    raise AttributeError(f"module 'mt' has no attribute {name!r}")
