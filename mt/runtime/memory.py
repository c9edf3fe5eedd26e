"""Handing freed heap memory back to the operating system, and asking for huge pages.

On CPU, tensors live in the C library's heap. glibc keeps freed blocks for reuse, and
training allocates blocks of a new size for every batch shape, so freed blocks of earlier
shapes pile up: resident memory stays far above what is live. `malloc_trim` returns the free
pages. Trimming costs the next allocations their page faults again, so it is done between
phases (training, validation), not per update (figures: docs/performance.md).
"""

from __future__ import annotations

import ctypes
import os


def prefer_huge_pages() -> None:
    """PyTorch's CPU allocator backs tensors of 2 MB and more with transparent huge pages when
    THP_MEM_ALLOC_ENABLE is set (read once, at the first such allocation): a lower peak RSS
    and fewer page faults in CPU training (docs/performance.md). Called where training starts
    (mt.train.build.build_trainer); set the variable to 0 to opt out. No effect once torch
    has made a large allocation."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def _find_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent from musl and macOS
    except (OSError, AttributeError):
        return None


_TRIM = _find_trim()


def release_free_memory() -> bool:
    """Give the heap's free pages back to the OS; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
