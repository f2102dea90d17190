"""Restart from a snapshot vs per-step fault tolerance, side by side, plus the corruption checks.

    python -m source_code.resilience.compare --steps 40 --kill-at-step 10 --snapshot-every 8

One kill at the same point in both runs (worker 1 dies inside its gradient all-reduce once
``--kill-at-step`` steps are done), on the same model, data and batches:
* restart: restart_train.py under torchrun (snapshots every K steps, --max-restarts=1): after the
  kill torchrun stops the other worker and starts both again, and they resume from the
  snapshot (a Slurm requeue does the same with a new job, and pays a new allocation too);
* per-step fault tolerance: ft_run.py (torchft's lighthouse and one process per replica group).
Both are measured from their step logs (recovery.py): steps and samples lost, the steps thrown
away, time without progress, goodput, the loss at equal steps and at equal time. Then the
corruption drill (sdc_drill.py): bits flipped in one replica's state (found by the checksums)
and in one rank's gradient (the checksums agree; found by the gradient check and a replay on
the same device, then on another), each attributed. The last line:
``summary: ft_steps_lost=0 restart_steps_lost=B ft_discarded_steps=D ft_samples_lost=F
restart_samples_lost=R heal_bitwise_equal=1 sdc_detected_rank=1 sdc_compute_fault_detected=1 ...``;
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
from source_code.resilience import common, ft_run, recovery, sdc_drill, young_daly


def run_restart(steps: int, kill_at: int, snapshot_every: int, step_seconds: float,
                workdir: str, stream=None, batch_size: int = 32) -> dict:
    """One torchrun job with --max-restarts=1: rank 1 dies in the all-reduce after ``kill_at``
    steps, torchrun stops rank 0 and starts both workers again, they resume from the snapshot."""
    logs = os.path.join(workdir, "restart_logs")
    shutil.rmtree(logs, ignore_errors=True)
    snap = os.path.join(workdir, "restart_snapshot.pt")
    if os.path.exists(snap):
        os.remove(snap)
    job = processes.torchrun("source_code.resilience.restart_train", "--steps", steps,
                             "--snapshot-every", snapshot_every, "--step-seconds", step_seconds,
                             "--batch-size", batch_size, "--checkpoint", snap, "--log-dir", logs,
                             "--kill-at-step", kill_at, nproc=2, device="cpu", extra=["--max-restarts=1"],
                             # the restarted workers get a store of their own, not the dead attempt's keys
                             env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, stream=False, timeout=180)
    if "killed in the all-reduce" not in job.stdout:
        raise processes.ProcessesFailed("the drill's job ran without the kill:\n" + job.stdout[-2000:])
    if stream or (stream is None and processes.in_notebook()):
        # the job's own lines (rank 0's traceback from the failed all-reduce left out)
        for line in job.stdout.splitlines():
            if line.startswith(("rank 1: killed", "attempt ")):
                print(f"restart run: {line}", flush=True)
    events = {r: common.read_log(os.path.join(logs, f"rank_{r}.jsonl")) for r in range(2)}
    return {**recovery.restart_metrics(events, batch_size), "events": events}


# the corruption drill's faults, one run (kind, rank, step): each kind of check and verdict once
SDC_FAULTS = (("state-repeat", 2, 2), ("state-once", 1, 3), ("compute-once", 0, 4),
              ("compute-repeat", 1, 6), ("compute-data", 2, 7))


def compare(steps: int = 40, kill_at: int = 10, snapshot_every: int = 8, step_seconds: float = 0.05,
            failures_per_day: float = 1.0, workdir=None, stream=None, batch_size: int = 32) -> dict:
    workdir = workdir or tempfile.mkdtemp(prefix="resilience_")
    ft = ft_run.run(replicas=2, steps=steps, kill_at=kill_at, step_seconds=step_seconds,
                    batch_size=batch_size, workdir=workdir, stream=stream)
    restart = run_restart(steps, kill_at, snapshot_every, step_seconds, workdir, stream, batch_size)
    # losses at equal steps (the restart's last) and at equal time (the shorter run's length)
    seconds = min(ft["seconds"], restart["seconds"])
    for run in (ft, restart):
        run["loss_at_steps"] = recovery.loss_at_step(run["evals"], steps)
        run["loss_at_seconds"] = recovery.loss_at_seconds(run["evals"], seconds)
    mtbf_s = 86400 / failures_per_day
    found = sdc_drill.drill(SDC_FAULTS, steps=8, world_size=3, stream=stream)
    return {"ft": ft, "restart": restart, "steps": steps, "equal_seconds": seconds,
            "young_daly": {"snapshot_seconds": restart["snapshot_seconds"], "mtbf_seconds": mtbf_s,
                           "best_interval_seconds": young_daly.best_interval(restart["snapshot_seconds"], mtbf_s)},
            "sdc": found}


def sdc_figures(found: dict) -> dict:
    """The state fault's named rank, and whether every compute fault was found by the gradient
    check and its replay (named right) while the checksums agreed."""
    by_kind = {f["fault"]: f for f in found["faults"]}
    compute = [f for f in found["faults"] if f["fault"].startswith("compute")]
    return {"detected_rank": by_kind["state-once"]["detected_rank"] if "state-once" in by_kind else -1,
            "compute_fault_detected": int(bool(compute) and all(
                f["check"] == "gradient" and f["detected_rank"] == f["flip_rank"] and not f["checksum_named"]
                for f in compute))}


def summary_line(res: dict) -> str:
    ft, rs, sdc = res["ft"], res["restart"], sdc_figures(res["sdc"])
    return (f"summary: ft_steps_lost={ft['steps_lost']} restart_steps_lost={rs['steps_lost']} "
            f"ft_discarded_steps={ft['discarded']} ft_samples_lost={ft['samples_lost']} "
            f"restart_samples_lost={rs['samples_lost']} heal_bitwise_equal={int(ft['heal_bitwise_equal'])} "
            f"sdc_detected_rank={sdc['detected_rank']} sdc_compute_fault_detected={sdc['compute_fault_detected']} "
            f"seconds_without_progress ft={ft['seconds_without_progress']:.2f} "
            f"restart={rs['seconds_without_progress']:.2f} "
            f"heartbeat_timeout_s={ft['timeouts']['heartbeat_timeout_s']:.1f} "
            f"goodput_samples_per_s ft={ft['goodput']:.0f} restart={rs['goodput']:.0f} "
            f"loss_at_step_{res['steps']} ft={ft['loss_at_steps']['eval_loss']:.4f} "
            f"restart={rs['loss_at_steps']['eval_loss']:.4f} "
            f"best_snapshot_interval_s={res['young_daly']['best_interval_seconds']:.1f}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--kill-at-step", type=positive_int, default=10)
    p.add_argument("--snapshot-every", type=positive_int, default=8)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--batch-size", type=positive_int, default=32, help="global batch, split over 2 workers")
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
    ft_run.check(2, args.steps, args.kill_at_step, args.batch_size)
    ft_run.require_torchft()
    res = compare(args.steps, args.kill_at_step, args.snapshot_every, args.step_seconds,
                  args.failures_per_day, batch_size=args.batch_size)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(summary_line(res))
    return 0


if __name__ == "__main__":
    run_main(main)
