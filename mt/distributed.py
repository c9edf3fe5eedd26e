"""Data-parallel training with torch.distributed, launched by torchrun
(`torchrun --nproc_per_node N -m mt train CONFIG`). Without torchrun everything here is a
no-op for a single process."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank (a collective: all ranks call it)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank if it is True on any rank (so all ranks stop together)."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


def setup(device_name: str) -> tuple[Dist, str]:
    """Join the process group torchrun describes in the environment; returns the Dist and the
    device this rank should use."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist(), device_name
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name != "cpu" and torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return Dist(rank, world, local_rank), f"cuda:{local_rank}"
    return Dist(rank, world, local_rank), "cpu"


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
