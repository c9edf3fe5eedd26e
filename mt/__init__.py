"""mt: train, run and score Transformer translation models from one YAML config."""
import os

# PyTorch's CPU allocator backs tensors of 2 MB and more with transparent huge pages when this
# is set (read once, at the first such allocation): a lower peak RSS and fewer page faults in
# CPU training (docs/performance.md). Set it to 0 to
# opt out; it has no effect when torch made a large allocation before mt was imported.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"


def __getattr__(name: str):
    # The Python API, imported on first use so that `import mt` (and `mt --help`) stays light:
    # from mt import Translator, Sampling
    if name in ("Translator", "Sampling"):
        from mt.decode import translator
        return getattr(translator, name)
    raise AttributeError(f"module 'mt' has no attribute {name!r}")
