"""Notebook 18 (source_code/less_communication): what nbval does not cover.

The exercise's check with the reference and typical wrong answers, the entry point's flags
refused in one line before any work, its summary line once (the task and size where the goals
are met, the only multi-process test here), the floor of the markov task, and the link model's
arithmetic. The notebook itself (every method's run and its asserts) runs under nbval."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from source_code import costmodel, workload
from source_code.errors import LaunchError
from source_code.less_communication import compression, exercises, links, streaming, tasks, train
from source_code.less_communication.exercises import ExerciseFailed, check_outer_step
from source_code.solutions.nb18_less_communication import outer_step

TORCHRUN = dict(RANK="0", WORLD_SIZE="2")


def test_reference_outer_step_passes_fixed_and_drawn_cases():
    for seed in (0, 1, 2):
        assert check_outer_step(outer_step, strict=True, quiet=True, seed=seed)


@torch.no_grad()
def averaging_parameters(glob, local, opt, average):       # local SGD, not DiLoCo
    average(local)
    for g, p in zip(glob, local):
        g.copy_(p)


@torch.no_grad()
def this_worker_only(glob, local, opt, average):           # no all-reduce of the pseudo-gradient
    for g, p in zip(glob, local):
        g.grad = g - p
    opt.step()
    for p, g in zip(local, glob):
        p.copy_(g)


@torch.no_grad()
def wrong_sign(glob, local, opt, average):
    deltas = [p - g for g, p in zip(glob, local)]
    average(deltas)
    for g, d in zip(glob, deltas):
        g.grad = d
    opt.step()
    for p, g in zip(local, glob):
        p.copy_(g)


@torch.no_grad()
def workers_not_reset(glob, local, opt, average):
    deltas = [g - p for g, p in zip(glob, local)]
    average(deltas)
    for g, d in zip(glob, deltas):
        g.grad = d
    opt.step()


@torch.no_grad()
def average_without_outer_optimizer(glob, local, opt, average):   # global -= mean delta, no momentum
    deltas = [g - p for g, p in zip(glob, local)]
    average(deltas)
    for g, d, p in zip(glob, deltas, local):
        g.sub_(d)
        p.copy_(g)


@pytest.mark.parametrize("wrong, hint", [
    (averaging_parameters, "local SGD"),
    (this_worker_only, "never reached it"),
    (wrong_sign, "which way does a gradient point"),
    (workers_not_reset, "where does this worker continue"),
    (average_without_outer_optimizer, "local SGD"),     # the same thing written as a step
])
def test_wrong_outer_steps_get_one_line_diagnoses(wrong, hint, capsys):
    with pytest.raises(ExerciseFailed, match=re.escape(hint)):
        check_outer_step(wrong, strict=True, quiet=True, seed=0)
    assert not check_outer_step(wrong, seed=0)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("not yet:") and hint in out


def test_unfinished_and_crashing_answers_print_one_line(capsys):
    def todo(*args):
        raise NotImplementedError

    def crash(glob, local, opt, average):
        return glob[0] @ glob[1]

    assert not check_outer_step(todo)
    assert not check_outer_step(crash, seed=3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("not done yet") and "raised" in lines[1] and len(lines) == 2


def test_check_draws_cases_the_notebook_never_prints():
    a, b = exercises.cases(1), exercises.cases(2)
    assert len(a) == len(exercises.FIXED) + exercises.DRAWN
    drawn = lambda cs: [(c[0], c[1], c[2], tuple(t.shape for t in c[3])) for c in cs[len(exercises.FIXED):]]
    assert drawn(a) != drawn(b)


@pytest.mark.parametrize("argv, words", [
    (["--steps", "30"], "not a multiple of H=20"),
    (["--link", "moon"], "choose one of node"),
    (["--sweep", "ten"], "integers separated by commas"),
    (["--fragments", "3"], "does not split into --fragments 3"),
    (["--batch", "33"], "use a multiple of 2"),
    (["--rank", "0"], "positive integer"),
    (["--delay", "20"], "must be in [0, --every 20)"),
    (["--task", "lm"], "choose one of sort, markov"),
])
def test_bad_flags_are_refused_in_one_line(argv, words):
    with pytest.raises(LaunchError) as err:
        train.check(train.parse_args(argv), env=TORCHRUN)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_one_process_is_refused_before_any_work():
    with pytest.raises(LaunchError, match="at least 2 processes"):
        train.check(train.parse_args([]), env={})


def test_link_model_is_notebook_03s_ring():
    lk = links.link("inter-site")
    assert links.allreduce_seconds(1e6, lk, 4) == costmodel.predicted_time("ring", 4, 1e6, lk.alpha, lk.beta)
    n, c = 1e9, 0.5
    comm = links.allreduce_seconds(4 * n, "node", 8)
    assert links.step_fraction(n, "node", 8, c) == pytest.approx(comm / (c + comm))
    with pytest.raises(ValueError, match="unknown link"):
        links.link("moon")


def test_fragments_cover_the_model_in_order():
    params = [torch.zeros(n) for n in (5, 1, 7, 3, 3, 9, 2)]
    for k in range(1, len(params) + 1):
        groups = streaming.fragments(params, k)
        assert len(groups) == k and all(groups)
        assert [id(p) for g in groups for p in g] == [id(p) for p in params]


def test_entry_point_meets_the_goals_on_the_task_with_a_floor():
    """The run the notebook documents (section 3): on the markov task (a loss floor above 0) at
    dim 64, rank 2, 120 steps, PowerSGD and DiLoCo meet the bytes goals (P <= 0.1, D <= 0.05)
    and DiLoCo's relative loss gap meets G <= 0.05; P is also the model's shapes' count, G the
    printed losses' gap, and both losses lie above the task's floor. About 30 s on 2 cores."""
    steps, rank, dim = 120, 2, 64
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "source_code.less_communication.train", "--goals-only", "--task", "markov", "--dim", str(dim),
           "--rank", str(rank), "--steps", str(steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    last = lines[-1]
    m = re.search(r"^summary: .*methods=4 .* task=markov .* powersgd_bytes_ratio=(\S+) diloco_bytes_ratio=(\S+) "
                  r"diloco_loss_gap=(\S+)$", last)
    assert m, last
    p, d, g = map(float, m.groups())
    model = workload.build_model(workload.model_config(dim=dim, n_layers=2, vocab_size=tasks.vocab_size("markov"),
                                                       max_len=tasks.LENGTH), 0)
    n = sum(t.numel() for t in model.parameters())
    k = sum(rank * (t.shape[0] + t[0].numel()) if compression.compressible(t.shape, rank) else t.numel()
            for t in model.parameters())
    assert p == pytest.approx((2 * n + (steps - 2) * k) / (steps * n), abs=1e-4), last
    floor_line = next(line for line in lines if line.startswith("floor of the markov task"))
    f = re.search(r"([\d.]+) on the held-out set; DiLoCo H=20 ([\d.]+) against DDP ([\d.]+): relative gap G "
                  r"(-?[\d.]+), gap in excess loss over the floor (-?[\d.]+)", floor_line)
    assert f, floor_line
    floor, diloco, ddp, g_line, excess = map(float, f.groups())
    assert g == pytest.approx((diloco - ddp) / ddp, abs=2e-4) and g == pytest.approx(g_line, abs=1e-4), floor_line
    rounding = 1e-4 * (1 + abs(excess)) / (ddp - floor)       # the printed losses' 4 decimals
    assert excess == pytest.approx((diloco - ddp) / (ddp - floor), abs=rounding), floor_line
    assert min(ddp, diloco) > floor, f"no model beats the process that drew the tokens: {floor_line}"
    assert p <= 0.1 and d <= 0.05 and g <= 0.05, f"the goals should be met at dim {dim}, rank {rank}: {last}"


def test_markov_floor_is_the_chains_own_loss():
    """The exact expected floor against the chain's loss on many sampled sequences, and a
    model that knows nothing (uniform) far above it; sort's floor is 0."""
    big = tasks.dataset("markov", 4096, seed=7)
    sampled = tasks.sample_floor("markov", big)
    assert sampled == pytest.approx(tasks.expected_floor("markov"), abs=0.02)
    assert tasks.expected_floor("markov") < 0.7 * math.log(tasks.SYMBOLS)
    assert tasks.expected_floor("sort") == 0.0 == tasks.sample_floor("sort", tasks.held_out_set("sort", 0))
    x, y = big.tensors
    assert (x[:, 1:] == y[:, :-1]).all() and (y != -100).all(), "targets: the inputs shifted by one, all scored"
    with pytest.raises(ValueError, match="at or below the floor"):
        tasks.excess_gap(1.6, 1.4, 1.5)
    with pytest.raises(ValueError, match="choose one of sort, markov"):
        tasks.dataset("lm", 4, 0)


def test_streaming_delay_beyond_a_round_is_refused():
    params = [torch.zeros(3) for _ in range(4)]
    with pytest.raises(ValueError, match=r"tau must be in \[0, H=20\)"):
        streaming.StreamingDiLoCo(params, 20, 4, delay=20)
