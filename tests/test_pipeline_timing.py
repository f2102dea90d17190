"""Pipeline timing on a GPU, checked on the CPU: the clock waits for the device where work is
asynchronous, so waiting for a message never counts as computing."""
import time

import pytest
import torch

from source_code import measure
from source_code.pipeline import compare, schedules


def test_clock_synchronises_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(a))
    before = time.perf_counter()
    assert measure.clock(torch.device("cuda", 0)) >= before
    assert calls == [(torch.device("cuda", 0),)]
    measure.clock(torch.device("cpu"))
    measure.clock("cpu")
    assert len(calls) == 1  # the CPU path reads the clock at once


class AsyncLink:
    """The last of 2 stages on a pretend GPU: a receive returns at once (as NCCL's wait() does
    for the CPU) and its data lands ``delay`` s later; synchronising waits for it, like
    torch.cuda.synchronize waiting for the NCCL stream."""

    stage, n_stages, early_receives = 1, 2, False
    device = torch.device("cuda", 0)

    def __init__(self, delay):
        self.delay, self.lands = delay, 0.0

    def exchange(self, send=None, recv=None):
        if recv is None:
            return None
        self.lands = time.perf_counter() + self.delay
        return torch.randn(recv[0])

    def synchronize(self, *args):
        schedules.hold_until(max(self.lands, time.perf_counter()))

    def flush(self):
        pass


def test_waiting_for_a_message_is_idle_not_busy(monkeypatch):
    link = AsyncLink(delay=0.2)
    monkeypatch.setattr(torch.cuda, "synchronize", link.synchronize)
    torch.manual_seed(0)
    stage = torch.nn.Linear(8, 8)
    rep = schedules.run_step(stage, [("F", 0), ("B", 0)], link, (4, 8), targets=[torch.zeros(4, 8)],
                             loss_fn=lambda y, t: (y - t).pow(2).sum())
    fwd = rep["records"][0]
    assert fwd["kind"] == "F" and fwd["start"] >= link.lands  # started once the activation was there
    assert fwd["end"] - fwd["start"] < 0.1, fwd  # a tiny Linear: the 0.2 s wait is not in it


@pytest.mark.parametrize("hold", [None, {"F": 0.05, "B": 0.05}])
def test_cpu_path_never_synchronises(monkeypatch, hold):
    def refuse(*a):
        raise AssertionError("synchronize called on the CPU path")
    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    link = AsyncLink(delay=0.0)
    link.device = torch.device("cpu")
    rep = schedules.run_step(torch.nn.Linear(8, 8), [("F", 0), ("B", 0)], link, (4, 8),
                             targets=[torch.zeros(4, 8)], loss_fn=lambda y, t: (y - t).pow(2).sum(),
                             hold=hold)
    if hold:
        assert all(r["end"] - r["start"] >= 0.05 for r in rep["records"])


def test_schedules_are_compared_with_the_base_round_by_round():
    # the base slowed in round 2 (a busy neighbour) slows its partner of that round alike: the
    # ratios pair the two of one round, not the fastest of each
    step_s = {"base": [1.0, 2.0, 1.0], "other": [1.1, 2.4, 0.9], "third": [0.5, 0.5, 0.5]}
    ratios = compare.paired_ratios(step_s, "base")
    assert set(ratios) == {"other", "third"}
    assert ratios["other"] == pytest.approx([1.1, 1.2, 0.9]) and ratios["third"] == pytest.approx([0.5, 0.25, 0.5])
    with pytest.raises(ValueError):   # a schedule with a round missing is not paired with another round
        compare.paired_ratios({"base": [1.0, 2.0], "other": [1.0]}, "base")
