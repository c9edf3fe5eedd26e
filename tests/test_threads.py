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
