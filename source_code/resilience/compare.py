"""Restart from a snapshot vs per-step fault tolerance, side by side, plus the corruption checks.

    python -m source_code.resilience.compare --steps 20 --kill-at-step 10 --snapshot-every 8 --replicas 2

One kill at the same point in both runs (worker 1 dies inside its gradient all-reduce once
``--kill-at-step`` steps are done), on the same model, data and batches, ``--replicas`` workers:
* per-step fault tolerance: ft_run.py (torchft's lighthouse and one process per replica group),
  which trains at least ``--steps`` steps and until the killed group is back for a few steps;
* restart: restart_train.py under torchrun (snapshots every K steps, --max-restarts=1), to the
  step torchft ended at: after the kill torchrun stops the other workers and starts all again,
  and they resume from the snapshot (a Slurm requeue does the same with a new job, and waits for
  an allocation: minutes, where the relaunch here costs the seconds of a process start).
Both are measured from their step logs (recovery.py): steps lost, samples lost (never trained)
and, apart from them, sample computations thrown away, the steps discarded, time without
progress; over one window for both (from the kill to the step where torchft has every group
back) the seconds it took, split into the failure's (torchft's heal step beyond the pace of its other
steps included) and the stepping's (whose pace can differ between two runs made one after the other,
and holds each way's own costs: torchft's quorum and commit, the restart's snapshots), the samples trained and the goodput, also with both runs' steps
at one pace; the loss at equal steps (the end) and
at equal time after the kill (both back at full batch). The model is fixed and tiny (the
lesson is the failures); ``--step-seconds`` stands in for a bigger model's step time. Then the
corruption drill (sdc_drill.py): bits flipped in one replica's state (found by the checksums)
and in one rank's gradient (the checksums agree; found by the gradient check and a replay on
the same device, then on another), each attributed, and a low bit of one gradient element,
which neither check sees. The last line:
``summary: ft_steps_lost=0 restart_steps_lost=B ft_discarded_steps=D ft_samples_lost=F
restart_samples_lost=R ft_samples_thrown_away=G restart_samples_thrown_away=H heal_bitwise_equal=1
sdc_detected_rank=1 sdc_compute_fault_detected=1 sdc_small_fault_found=0 ...``;
``--out FILE`` keeps every number as JSON for a notebook to reuse.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from source_code import processes
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, forked, ft_run, recovery, restart_train, sdc_drill, young_daly


def run_restart(steps: int, kill_at: int, snapshot_every: int, step_seconds: float,
                workdir: str, stream=None, batch_size: int = 32, nproc: int = 2, timeout: float = 180) -> dict:
    """One torchrun job with --max-restarts=1: rank 1 dies in the all-reduce after ``kill_at``
    steps, torchrun stops rank 0 and starts both workers again, they resume from the snapshot.
    torchrun's own main(), forked with torch imported (forked.py), forks its workers
    (``--start-method=fork --run-path``): the relaunch costs no Python start-up here, where a
    requeue on a cluster costs minutes."""
    logs = os.path.join(workdir, "restart_logs")
    shutil.rmtree(logs, ignore_errors=True)
    snap = os.path.join(workdir, "restart_snapshot.pt")
    if os.path.exists(snap):
        os.remove(snap)
    argv = ["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=1", "--monitor-interval=0.1",
            "--start-method=fork", "--run-path", restart_train.__file__, "--steps", steps,
            "--snapshot-every", snapshot_every, "--step-seconds", step_seconds, "--batch-size", batch_size,
            "--checkpoint", snap, "--log-dir", logs, "--kill-at-step", kill_at]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKSHOP_DEVICE": "cpu",
           # the restarted workers get a store of their own, not the dead attempt's keys
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    stream = processes.in_notebook() if stream is None else stream

    def show(line: str) -> None:      # the job's own lines (not rank 0's traceback of the failed all-reduce)
        if stream and line.startswith(("rank 1: killed", "attempt ")):
            print(f"restart run: {line}", end="", flush=True)
    out = os.path.join(workdir, "restart_torchrun.out")
    job = forked.start("torch.distributed.run", argv, out, env)
    tail = forked.Tail(out, job, show)
    job.join(timeout)
    forked.kill(job)
    text = "".join(tail.join())
    if job.exitcode != 0 or "killed in the all-reduce" not in text:
        raise processes.ProcessesFailed(f"the restart drill's job (exit {job.exitcode}) ran without the kill "
                                        "or failed:\n" + text[-2000:])
    events = {r: common.read_log(os.path.join(logs, f"rank_{r}.jsonl")) for r in range(nproc)}
    return {**recovery.restart_metrics(events, batch_size), "events": events}


# the corruption drill's faults, one run (kind, rank, step): each kind of check and verdict once
SDC_FAULTS = (("state-repeat", 2, 2), ("state-once", 1, 3), ("compute-once", 0, 4),
              ("compute-small", 2, 5), ("compute-repeat", 1, 6), ("compute-data", 2, 7))


def compare(steps: int = 20, kill_at: int = 10, snapshot_every: int = 8, step_seconds: float = 0.05,
            failures_per_day: float = 1.0, workdir=None, stream=None, batch_size: int = 32,
            replicas: int = 2) -> dict:
    """Both ways side by side (``replicas`` groups or workers each), then the corruption drill."""
    workdir = workdir or tempfile.mkdtemp(prefix="resilience_")
    ft = ft_run.run(replicas=replicas, steps=steps, kill_at=kill_at, step_seconds=step_seconds,
                    batch_size=batch_size, workdir=workdir, stream=stream)
    if ft["full_step"] is None or ft["final_step"] is None:
        raise processes.ProcessesFailed("the torchft run never had every group back at full batch")
    # the restart trains the same global steps as torchft did: both end at the same step
    restart = run_restart(ft["final_step"], kill_at, snapshot_every, step_seconds, workdir, stream,
                          batch_size, nproc=replicas)
    # one window for both: from the kill to the step where torchft trains with every group again
    until = max(ft["full_step"], kill_at + 1)
    for run in (ft, restart):
        run["window"] = recovery.window(run, kill_at, until, batch_size)
    # where each window's seconds went, measured in the runs' step logs
    ft["window"]["parts"] = recovery.ft_time_parts(ft, ft["events"], ft["victim"], until)
    ft["window"]["pause"] = recovery.longest_pause(ft, ft["events"], ft["victim"], until)
    restart["window"]["parts"] = recovery.restart_time_parts(restart, restart["events"], until)
    # the failure's seconds apart from the pace of the window's steps, and both goodputs at one pace
    runs, new_steps = {"torchft": ft, "restart": restart}, until - kill_at
    for name, run in runs.items():
        run["window"].update(recovery.split_window(run["window"], recovery.FAILURE_PARTS[name], new_steps,
                                                   recovery.LONGER_STEPS[name]))
    # a cost of the restart's own way inside its pace: the snapshots written in its window
    # (step -> the slowest rank's seconds writing it)
    snaps = restart["window"]["snapshots_s"] = {}
    for e in (e for evs in restart["events"].values() for e in evs if e.get("event") == "snapshot"):
        if e["t"] > restart["kill_t"] and kill_at < e["step"] <= until:
            snaps[e["step"]] = max(snaps.get(e["step"], 0.0), e["seconds"])
    paces = {name: run["window"]["pace_s"] for name, run in runs.items()}
    for run in runs.values():
        run["window"]["goodput_at_pace"] = {name: recovery.goodput_at_pace(run["window"], new_steps, pace)
                                            for name, pace in paces.items()}
    after = max(run["window"]["seconds"] for run in (ft, restart))     # both back at full batch
    for run in (ft, restart):
        run["loss_at_seconds"] = recovery.loss_at_seconds(run["evals"], run["kill_t"] - run["start_t"] + after)
    mtbf_s = 86400 / failures_per_day
    found = sdc_drill.drill(SDC_FAULTS, steps=8, world_size=3, stream=stream)
    return {"ft": ft, "restart": restart, "steps": ft["final_step"], "window_step": until,
            "equal_seconds_after_kill": after, "replicas": replicas, "batch_size": batch_size,
            "young_daly": {"snapshot_seconds": restart["snapshot_seconds"], "mtbf_seconds": mtbf_s,
                           "best_interval_seconds": young_daly.best_interval(restart["snapshot_seconds"], mtbf_s)},
            "sdc": found}


def sdc_figures(found: dict) -> dict:
    """The state fault's named rank; whether every large compute fault was found by the gradient
    check (which the drill consults only where the checksums named no rank) and its replay
    named the right rank; whether the small one (a low mantissa bit) was found by anything."""
    by_kind = {f["fault"]: f for f in found["faults"]}
    large = [f for f in found["faults"] if f["fault"] in ("compute-once", "compute-repeat", "compute-data")]
    small = by_kind.get("compute-small")
    return {"detected_rank": by_kind["state-once"]["detected_rank"] if "state-once" in by_kind else -1,
            "compute_fault_detected": int(bool(large) and all(
                f["check"] == "gradient" and f["detected_rank"] == f["flip_rank"] for f in large)),
            "small_fault_found": -1 if small is None else int(small["check"] != "none")}


def summary_line(res: dict) -> str:
    ft, rs, sdc = res["ft"], res["restart"], sdc_figures(res["sdc"])
    fw, rw = ft["window"], rs["window"]
    return (f"summary: ft_steps_lost={ft['steps_lost']} restart_steps_lost={rs['steps_lost']} "
            f"ft_discarded_steps={ft['discarded']} ft_samples_lost={ft['samples_lost']} "
            f"restart_samples_lost={rs['samples_lost']} ft_samples_thrown_away={ft['samples_thrown_away']} "
            f"restart_samples_thrown_away={rs['samples_thrown_away']} heal_bitwise_equal={int(ft['heal_bitwise_equal'])} "
            f"sdc_detected_rank={sdc['detected_rank']} sdc_compute_fault_detected={sdc['compute_fault_detected']} "
            f"sdc_small_fault_found={sdc['small_fault_found']} "
            f"seconds_without_progress ft={ft['seconds_without_progress']:.2f} "
            f"restart={rs['seconds_without_progress']:.2f} "
            f"heartbeat_timeout_s={ft['timeouts']['heartbeat_timeout_s']:.1f} "
            f"step_ms_when_nothing_fails ft={1e3 * ft['step_seconds']:.0f} restart={1e3 * rs['step_seconds']:.0f} "
            f"kill_to_step_{res['window_step']}: goodput_samples_per_s ft={fw['goodput']:.0f} restart={rw['goodput']:.0f} "
            f"failure_s ft={fw['failure_s']:.2f} restart={rw['failure_s']:.2f} "
            f"ft_heal_step_excess_s={fw['longer_steps_excess_s']:.2f} "
            f"restart_snapshot_ms_in_window={1e3 * sum(rw['snapshots_s'].values()):.0f} "
            f"step_ms ft={1e3 * fw['pace_s']:.0f} restart={1e3 * rw['pace_s']:.0f} "
            f"goodput_at_restart_pace ft={fw['goodput_at_pace']['restart']:.0f} restart={rw['goodput_at_pace']['restart']:.0f} "
            f"loss_at_step_{res['steps']} ft={ft['final_loss']:.4f} restart={rs['final_loss']:.4f} "
            f"loss_{res['equal_seconds_after_kill']:.2f}s_after_kill ft={ft['loss_at_seconds']['eval_loss']:.4f} "
            f"restart={rs['loss_at_seconds']['eval_loss']:.4f} "
            f"best_snapshot_interval_s={res['young_daly']['best_interval_seconds']:.1f}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=20,
                   help="the least global steps; both runs end where torchft stops (its groups together again)")
    p.add_argument("--kill-at-step", type=positive_int, default=10)
    p.add_argument("--snapshot-every", type=positive_int, default=8)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--batch-size", type=positive_int, default=32, help="global batch, split over the replicas")
    p.add_argument("--replicas", type=positive_int, default=2,
                   help="torchft's replica groups, and the restarted job's workers (one process each)")
    p.add_argument("--failures-per-day", type=float, default=1.0,
                   help="failure rate of the whole job, for the snapshot interval")
    p.add_argument("--out", default="", help="write every number as JSON here")
    args = p.parse_args(argv)
    if not args.kill_at_step < args.steps:
        raise LaunchError(f"error: --kill-at-step {args.kill_at_step} must be below --steps {args.steps}")
    if args.kill_at_step % args.snapshot_every == 0:
        raise LaunchError("error: --kill-at-step falls on a snapshot step, so a restart loses nothing; "
                          "pick a step between snapshots")
    if not (args.step_seconds >= 0 and args.failures_per_day > 0):
        raise LaunchError("error: --step-seconds must be >= 0 and --failures-per-day > 0")
    ft_run.check(args.replicas, args.steps, args.kill_at_step, args.batch_size)
    ft_run.require_torchft()
    res = compare(args.steps, args.kill_at_step, args.snapshot_every, args.step_seconds,
                  args.failures_per_day, batch_size=args.batch_size, replicas=args.replicas)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(summary_line(res))
    return 0


if __name__ == "__main__":
    run_main(main)
