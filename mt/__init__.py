"""mt: train, run and score Transformer translation models from one YAML config."""
import os

# PyTorch's CPU allocator backs tensors of 2 MB and more with transparent huge pages when this
# is set (read once, at the first such allocation). Measured on CPU training of the small
# model (scripts/bench_train.py): peak RSS about 12% lower, fewer page faults. Set it to 0 to
# opt out; it has no effect when torch made a large allocation before mt was imported.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
