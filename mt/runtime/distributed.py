"""Data-parallel training with torch.distributed, launched by torchrun
(`torchrun --nproc_per_node N -m mt train CONFIG`). Without torchrun everything here is a
no-op for a single process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from mt.errors import MTError, first_line
from mt.runtime.env import env_int


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # a gloo group with a long timeout, for the other ranks to wait in while rank 0 alone
    # downloads, trains BPE or validates (see setup)
    wait_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @contextmanager
    def together(self, what: str) -> Iterator[None]:
        """A collective of all ranks, whose failure (a rank died, or hung for longer than
        train.dist_timeout_minutes) ends this rank with one line instead of a traceback."""
        try:
            yield
        except RuntimeError as e:  # gloo's and NCCL's errors alike (DistBackendError too)
            why = first_line(e, 1000)
            raise MTError(
                f"rank {self.rank}: {what} with the other ranks failed ({why.split('] ')[-1]}): "
                f"another rank died, or hung for longer than train.dist_timeout_minutes; the same "
                f"command started again resumes from the run's last saved step (last.pt)"
            ) from None

    def barrier(self) -> None:
        if self.enabled:
            with self.together("a barrier"):
                dist.barrier()

    def wait_for_main(self, flag: bool = False) -> bool:
        """All ranks meet here after work that rank 0 does alone, and take its `flag` (early
        stopping, after a validation); the others may wait up to train.dist_wait_minutes
        instead of the collective timeout."""
        if not self.enabled:
            return flag
        t = torch.tensor([float(flag)])  # (the wait group is gloo's: on the host)
        with self.together("waiting for rank 0"):
            dist.broadcast(t, src=0, group=self.wait_group)
        return bool(t.item())

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            with self.together("a sum"):
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def broadcast_parameters(self, model) -> None:
        """Every rank takes rank 0's weights (and buffers)."""
        if self.enabled:
            with self.together("taking rank 0's weights"):
                for t in model.state_dict().values():
                    dist.broadcast(t, src=0)

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank (a collective: all ranks call it)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        with self.together("a gather"):
            dist.all_gather_object(out, obj)
        return out

    def max_each(self, values: list[float], device: torch.device) -> list[float]:
        """Each value's largest over the ranks, on every rank, in one collective."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=device)
        with self.together("a maximum"):
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()


def setup(
    device_name: str, timeout_minutes: float = 30.0, wait_minutes: float = 240.0, log=None
) -> tuple[Dist, str]:
    """Join the process group torchrun describes in the environment; returns the Dist and the
    device this rank should use.

    Two timeouts: collectives in the training loop fail after `timeout_minutes` (a hung rank
    should end the job), while waits for rank 0's solo work (corpus download, BPE training,
    validation, which take hours on a WMT-size corpus) use a gloo group of their own that
    allows `wait_minutes`. Outside torchrun (variables set by hand, a SLURM script, or left
    over from an earlier torchrun) it says at once to `log` what it waits for, and a group
    that does not form within `timeout_minutes` is one line naming what to unset."""
    world = env_int("WORLD_SIZE")
    if world == 1:
        return Dist(), device_name
    if "RANK" not in os.environ:
        raise MTError(
            f"WORLD_SIZE={world} but RANK is not set: start the processes with torchrun, or "
            f"unset WORLD_SIZE"
        )
    rank = env_int("RANK")
    if rank >= world:
        raise MTError(
            f"RANK={rank} is not below WORLD_SIZE={world}: start the processes with torchrun, "
            f"or unset RANK and WORLD_SIZE (left by an earlier torchrun?)"
        )
    local_rank = env_int("LOCAL_RANK")
    if (local_world := env_int("LOCAL_WORLD_SIZE")) and local_rank >= local_world:
        raise MTError(
            f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}: start the "
            f"processes with torchrun, or unset LOCAL_RANK and LOCAL_WORLD_SIZE"
        )
    use_cuda = device_name != "cpu" and torch.cuda.is_available()
    # every rank of the machine checks (torchrun's LOCAL_WORLD_SIZE), so all of them stop with
    # this line; torch.cuda.set_device would stop only the extra ones, with "invalid device
    # ordinal", and leave the others waiting for them
    local_world = max(local_world, local_rank + 1)
    if use_cuda and local_world > (n := torch.cuda.device_count()):
        raise MTError(
            f"torchrun started {local_world} processes on this machine, which has "
            f"{n} GPU{'s' * (n != 1)}: use --nproc-per-node {n}, one process per "
            f"GPU, or train.device: cpu"
        )
    if not dist.is_initialized():
        _join(rank, world, use_cuda, timeout_minutes, log)
    wait_group = dist.new_group(backend="gloo", timeout=timedelta(minutes=wait_minutes))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return Dist(rank, world, local_rank, wait_group), f"cuda:{local_rank}"
    return Dist(rank, world, local_rank, wait_group), "cpu"


def _join(rank: int, world: int, use_cuda: bool, timeout_minutes: float, log) -> None:
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    if "TORCHELASTIC_RUN_ID" not in os.environ and log is not None:  # (torchrun sets it)
        log(
            f"joining a group of {world} processes at {where} as rank {rank} (WORLD_SIZE, "
            f"RANK, MASTER_ADDR, MASTER_PORT in the environment); waiting up to "
            f"{timeout_minutes:g} minutes (train.dist_timeout_minutes) for the others"
        )
    try:
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=timedelta(minutes=timeout_minutes),
            **_store_of_this_start(rank, world, timeout_minutes),
        )
    except (RuntimeError, TimeoutError, ValueError) as e:  # (DistStoreError is a RuntimeError)
        reason = first_line(e, 160)
        raise MTError(
            f"the group of {world} processes at {where} did not form ({reason}): if no "
            f"other process is starting, unset WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and "
            f"MASTER_PORT (left by an earlier torchrun?); else start them all, or raise "
            f"train.dist_timeout_minutes"
        ) from None


def _store_of_this_start(rank: int, world: int, timeout_minutes: float) -> dict:
    """init_process_group's store where torchrun restarted the workers (--max-restarts):
    the store its agent keeps is shared by every start, and the group's keys (where each rank
    listens) would still hold the dead workers' addresses, which a new rank may read before
    its peer has written its own ("Connection refused"): each start gets keys of its own. {}:
    the env:// default (a first start, or no torchrun)."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),  # (set by torchrun)
        is_master=False,
        timeout=timedelta(minutes=timeout_minutes),
    )
    return {
        "store": dist.PrefixStore(f"mt/start_{restart}/", agent),
        "rank": rank,
        "world_size": world,
    }


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
