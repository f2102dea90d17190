"""The table of what each way lost, printed from ``compare.compare``'s results: notebook 17's
section 1 (restart from a snapshot vs torchft, one kill, the same model and batches).

    from source_code.resilience import compare, report
    report.tables(compare.compare(steps=20, kill_at=10, snapshot_every=8, workdir="/tmp/r"), kill_at=10)
"""
from __future__ import annotations


def _table(title: str, rows) -> None:
    print(f"{title:46s}{'restart':>14s}{'torchft':>14s}")
    for name, restart_value, ft_value in rows:
        print(f"  {name:44s}{restart_value!s:>14s}{ft_value!s:>14s}")


def tables(res: dict, kill_at: int) -> None:
    """Print the run's figures side by side, restart first: over the whole run, from the kill,
    over one window for both, when nothing fails, and the eval loss at equal steps and time."""
    rs, ft = res["restart"], res["ft"]
    ft_window, restart_window = ft["window"], rs["window"]
    after, batch = res["equal_seconds_after_kill"], res["batch_size"]
    new_step, new_steps = kill_at + 1, res["window_step"] - kill_at
    at_time = {"restart": rs["loss_at_seconds"], "torchft": ft["loss_at_seconds"]}
    relaunch = next(iter(restart_window["parts"]))     # the restart's first part: its relaunch

    def both(value, fmt):                    # one figure of each run, restart first
        return tuple(format(value(run), fmt) for run in (rs, ft))

    _table("over the whole run", [
        ("steps lost", *both(lambda run: run["steps_lost"], "d")),
        ("steps discarded after the kill", "-", ft["discarded"]),
        ("samples trained", *both(lambda run: run["samples_trained"], "d")),
        ("samples lost (never trained)", *both(lambda run: run["samples_lost"], "d")),
        ("sample computations thrown away", *both(lambda run: run["samples_thrown_away"], "d"))])
    _table("seconds from the kill", [
        ("to the restarted workers' gloo group built", f"{restart_window['parts'][relaunch]:.2f}", "-"),
        ("to group 1's Manager built", "-", f"{ft['replacement_s']['up']:.2f}"),
        ("to the next commit", *both(lambda run: run["seconds_without_progress"], ".2f")),
        (f"to step {new_step}", *both(lambda run: run["commits"][new_step] - run["kill_t"], ".2f"))])
    _table(f"window: the kill to step {res['window_step']}", [
        ("seconds", *both(lambda run: run["window"]["seconds"], ".2f")),
        ("  the failure's: no new step, or a longer one", *both(lambda run: run["window"]["failure_s"], ".2f")),
        ("    of it, the heal step beyond the pace", "-", f"{ft_window['longer_steps_excess_s']:.2f}"),
        (f"  the {new_steps} new steps: ms a step", *both(lambda run: 1e3 * run["window"]["pace_s"], ".0f")),
        ("    of them, snapshots written: ms in all", f"{1e3 * sum(restart_window['snapshots_s'].values()):.0f}", "-"),
        ("samples trained", *both(lambda run: run["window"]["samples_trained"], "d")),
        ("goodput, samples trained per second", *both(lambda run: run["window"]["goodput"], ".0f")),
        *((f"  the same, new steps at {name}'s pace", *both(lambda run: run["window"]["goodput_at_pace"][name], ".0f"))
          for name in ("restart", "torchft"))])
    _table("when nothing fails (before the kill)", [
        ("step, ms", *both(lambda run: 1e3 * run["step_seconds"], ".0f")),
        ("samples per second", *both(lambda run: batch / run["step_seconds"], ".0f"))])
    _table("eval loss (step held)", [
        (f"at step {res['steps']} (both end there)", *both(lambda run: run["final_loss"], ".4f")),
        (f"{after:.2f} s after the kill", *(f"{at_time[n]['eval_loss']:.4f} ({at_time[n]['step']})" for n in at_time))])
