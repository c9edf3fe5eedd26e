"""mt's thread count on a shared machine (mt/runtime/threads.py): the cores other processes
leave free, said in one line; an explicit count wins. The speed behind it is measured by
scripts/bench/bench_threads.py, not here."""

import pytest
import torch

from mt.runtime import threads


@pytest.fixture
def machine(monkeypatch):
    """A 2-core machine whose neighbours' load the test sets; torch's threads restored after."""
    before = torch.get_num_threads()
    monkeypatch.delenv("MT_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    torch.set_num_threads(2)
    load = {"busy": 0.0}
    monkeypatch.setattr(threads, "busy_cores", lambda interval=0.3: load["busy"])
    yield load
    torch.set_num_threads(before)


def test_an_idle_machine_keeps_every_thread_and_says_nothing(machine):
    said = []
    assert threads.choose_threads(log=said.append) == 2 and torch.get_num_threads() == 2
    assert said == []


@pytest.mark.parametrize("busy, expected", [(0.9, 1), (1.6, 1), (2.0, 1), (0.3, 2)])
def test_a_busy_neighbour_leaves_the_free_cores(machine, busy, expected):
    machine["busy"] = busy
    said = []
    assert threads.choose_threads(log=said.append) == expected == torch.get_num_threads()
    if expected < 2:
        assert len(said) == 1 and "busy" in said[0] and "train.num_threads" in said[0]


def test_an_explicit_count_wins_over_the_load(machine, monkeypatch):
    machine["busy"] = 2.0
    assert threads.choose_threads(2, log=print) == 2 == torch.get_num_threads()
    monkeypatch.setenv("MT_THREADS", "2")
    assert threads.choose_threads(log=print) == 2


def test_busy_cores_reads_the_machine():
    assert 0.0 <= threads.busy_cores(0.05) <= threads.usable_cores() + 0.5


def _stat(path, per_core: dict[int, tuple[int, int]]) -> None:
    """A /proc/stat whose cores have (busy, idle) jiffies as given."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for core, (busy, idle) in per_core.items():
        lines.append(f"cpu{core} {busy} 0 0 {idle} 0 0 0 0 0 0")
    path.write_text("\n".join(lines) + "\nintr 0\n")


def test_busy_cores_counts_only_this_process_s_cpu_set(tmp_path, monkeypatch):
    """Pinned to core 1 (taskset -c 1) while a neighbour keeps core 0 busy: core 1 is free."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(threads, "PROC_STAT", str(stat))
    snapshots = iter([{0: (100, 0), 1: (0, 100)}, {0: (200, 0), 1: (0, 200)}])
    monkeypatch.setattr(threads.time, "sleep", lambda _s: _stat(stat, next(snapshots)))
    _stat(stat, next(snapshots))
    monkeypatch.setattr(threads, "_affinity", lambda: {1})
    assert threads.busy_cores() == 0.0
    snapshots = iter([{0: (100, 0), 1: (0, 100)}, {0: (200, 0), 1: (0, 200)}])
    _stat(stat, next(snapshots))
    monkeypatch.setattr(threads, "_affinity", lambda: {0, 1})
    assert threads.busy_cores() == pytest.approx(1.0)  # the whole machine: one core busy


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.0),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_a_container_s_cpu_quota_caps_the_usable_cores(tmp_path, monkeypatch, files, limit):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(threads, "CGROUP", str(tmp_path))
    monkeypatch.setattr(threads, "_affinity", lambda: {0, 1, 2, 3})
    assert threads.cgroup_cpu_limit() == limit
    assert threads.usable_cores() == (4 if limit is None else max(1, int(-(-limit // 1))))
