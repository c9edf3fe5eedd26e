"""Counting the places where Python waits for a tensor's values (a host sync on a GPU): every
`.item()`, `.tolist()`, `bool()`/`int()`/`float()` of a tensor, `nonzero()`, `.cpu()`,
`.numpy()`, `.to("cpu")`, indexing with a boolean mask (whose result's size depends on the
values) or with a Python list (`t[:, [0, 1]]`: the list is copied from the host as a tensor),
and a Python number written through a basic index (`t[i] = 0.0`: a copy from the host). On
a GPU each one stalls the host until the device has caught up, so a decoding or training step
written to stay on the device keeps them out of its loop. They are counted the same way on
the CPU, where a test can see them without a GPU:

    with HostSyncs() as syncs:
        search(model, src, mask, DecodeOptions(beam=5))
    print(syncs.count, syncs.where)
"""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.masked_select,
    torch.masked_select,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
}


def _to_host(args, kwargs) -> bool:
    """Tensor.to("cpu"): a copy to the host, which waits for the device. (Only the string is
    told apart: a torch.device("cpu") is what a CPU run passes for its device too.)"""
    return "cpu" in (*args[1:2], kwargs.get("device"))


def _scalar_write(args) -> bool:
    """t[i] = 0.0 with a basic index (ints, slices): the number becomes a CPU tensor that is
    copied to the device, and a copy from the host waits for it (t[i].fill_(0.0) passes the
    number to the kernel instead). An index of tensors writes through index_put_, which takes
    the number as it is (a list index is counted as a list: _list_index)."""
    if len(args) < 3 or isinstance(args[2], torch.Tensor) or not isinstance(args[2], int | float):
        return False
    items = args[1] if isinstance(args[1], tuple) else (args[1],)
    return not any(isinstance(i, torch.Tensor | list) for i in items)


def _index_items(args) -> tuple:
    index = args[1] if len(args) > 1 else None
    return index if isinstance(index, tuple) else (index,)


def _bool_index(args) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in _index_items(args))


def _list_index(args) -> bool:
    """t[:, [0, 1, 2]]: the list becomes a tensor on the host, copied to the device (from
    pageable memory: the host waits) at every such index; a device tensor made once does not."""
    return any(isinstance(i, list) for i in _index_items(args))


class HostSyncs(TorchFunctionMode):
    """A context that counts host syncs (see the module's docstring); `where` counts them by
    the line of mt's code that made them."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.where: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reads = (
            func in _READS
            or (
                func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
                and (_bool_index(args) or _list_index(args))
            )
            or (func is torch.Tensor.__setitem__ and _scalar_write(args))
            or (func is torch.Tensor.to and _to_host(args, kwargs))
        )
        if reads and not (func in (torch.Tensor.nonzero, torch.nonzero) and _sized(kwargs)):
            self.count += 1
            self.where[_caller()] += 1
        return func(*args, **kwargs)


def _sized(kwargs: dict) -> bool:
    return kwargs.get("size") is not None  # nonzero(size=n) needs no sync


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()):
        if "/mt/" in frame.filename and "host_syncs" not in frame.filename:
            return f"{frame.filename.split('/mt/')[-1]}:{frame.lineno}"
    return "?"
