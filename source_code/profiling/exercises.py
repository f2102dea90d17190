"""Check function of notebook 15's exercise: find the bottleneck of a slow run from its profile
(reference solution: source_code/solutions/nb15_bottleneck.py).

    from source_code.profiling import slow_run
    from source_code.profiling.exercises import check_diagnosis
    profile = slow_run.run(steps=4, warmup=2, profile_steps=True)   # what the learner reads
    check_diagnosis("...", {...}, profile)              # one of SUSPECTS, and a fix

The answer names one of SUSPECTS and a fix: keyword arguments of ``slow_run.run`` from
``slow_run.SETTINGS`` (how the work runs, never how much). The check reads the diagnosis
against the profile it is given, then runs the slow run and the fixed one: a fix must take
the suspect's work off the training process (its CPU time per step, which other programs on
the machine do not change) by at least MIN_GAIN; the wall time per step of both is reported.
"""
from __future__ import annotations

from source_code.profiling import slow_run

SUSPECTS = ("computation", "data loading", "host sync")
RIGHT = "data loading"
MIN_GAIN = 1.5  # the training process's CPU time per step, slow / fixed


def _row(profile: dict, prefix: str) -> dict:
    """The profile's first row whose name starts with ``prefix`` (zeros if there is none)."""
    return next((r for r in profile["rows"] if r["name"].startswith(prefix)),
                {"name": prefix, "calls": 0, "time_ms": 0.0, "self_ms": 0.0, "total_ms": 0.0})


def evidence(profile: dict) -> dict:
    """What the profile says, per step: the step, the DataLoader's span, .item(), the convolutions."""
    return {"step_ms": _row(profile, "ProfilerStep")["total_ms"],
            "loader_ms": _row(profile, "enumerate(DataLoader)")["total_ms"],
            "item_ms": _row(profile, "aten::item")["total_ms"],
            "conv_calls": _row(profile, "aten::mkldnn_convolution")["calls"]}


def check_diagnosis(bottleneck: str, fix: dict, profile: dict) -> str:
    """Raise NotImplementedError while the answer is a TODO, AssertionError with a hint when the
    diagnosis or the fix is wrong; return (and print) what was measured when both are right."""
    if bottleneck == "TODO" or not isinstance(bottleneck, str):
        raise NotImplementedError("exercise not done yet: name the bottleneck and a fix, then run this cell again")
    ev = evidence(profile)
    assert bottleneck in SUSPECTS, f"{bottleneck!r} is not one of the suspects {SUSPECTS}"
    if bottleneck == "computation":
        raise AssertionError(
            f"not the model: aten::mkldnn_convolution runs {ev['conv_calls']:g} times per step, and "
            "SmallCNN has 2 convolutions. Hint: which span of the table contains the other calls? "
            "Compare the total time of each annotation with the step's")
    if bottleneck == "host sync":
        raise AssertionError(
            f"not here: aten::item takes {ev['item_ms']:.3f} ms of a {ev['step_ms']:.1f} ms step. On a CPU "
            ".item() has nothing to wait for (on a GPU it would wait for the queued kernels, and the "
            "profile would show that time in aten::item). Hint: compare the total time of each annotation "
            "with the step's")
    unknown = set(fix) - set(slow_run.SETTINGS)
    assert not unknown, (f"{sorted(unknown)}: a fix changes how the work runs ({', '.join(slow_run.SETTINGS)}), "
                         "not how much work there is")
    assert fix, f"right diagnosis; now the fix: a dict of settings among {slow_run.SETTINGS}"
    slow, fixed = slow_run.run(), slow_run.run(**fix)
    gain = slow["cpu_ms"] / fixed["cpu_ms"]
    assert gain >= MIN_GAIN, (
        f"right diagnosis, but the fix {fix} leaves the training process busy {fixed['cpu_ms']:.1f} ms "
        f"per step (slow run: {slow['cpu_ms']:.1f} ms). Hint: which setting moves the loading out of "
        "this process?")
    msg = (f"correct: data loading. enumerate(DataLoader) holds {ev['loader_ms']:.1f} of the "
           f"{ev['step_ms']:.1f} ms of a step; with {fix} the training process computes "
           f"{fixed['cpu_ms']:.1f} ms per step instead of {slow['cpu_ms']:.1f} ({gain:.1f}x less), and a step "
           f"takes {fixed['step_ms']:.1f} ms of wall time instead of {slow['step_ms']:.1f} "
           f"({slow['step_ms'] / fixed['step_ms']:.2f}x) on this machine's free cores")
    print(msg)
    return msg
