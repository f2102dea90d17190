"""Restart from a snapshot vs per-step fault tolerance, side by side, plus the bit-flip check.

    python -m source_code.resilience.compare --steps 40 --kill-at-step 10 --snapshot-every 8

One kill at the same step in both runs, on the same model, data and batches:
* restart: restart_train.py under torchrun (snapshots every K steps); after the kill ends the job,
  a new job of every worker resumes from the snapshot (what a Slurm requeue does);
* per-step fault tolerance: ft_run.py (torchft's lighthouse and one process per replica group).
Then the silent-data-corruption drill (sdc.py): a bit flipped once on one rank and one flipped
every time a step is computed on another, each found in one step and told apart by a replay.
The last line: ``summary: ... ft_steps_lost=A restart_steps_lost=B heal_bitwise_equal=1
sdc_detected_rank=R``; ``--out FILE`` keeps every number as JSON for a notebook to reuse.
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
                workdir: str, stream=None) -> dict:
    logs = os.path.join(workdir, "restart_logs")
    shutil.rmtree(logs, ignore_errors=True)
    snap = os.path.join(workdir, "restart_snapshot.pt")
    if os.path.exists(snap):
        os.remove(snap)
    args = ["--steps", steps, "--snapshot-every", snapshot_every, "--step-seconds", step_seconds,
            "--checkpoint", snap, "--log-dir", logs]
    # the job with the kill: torchrun stops the surviving rank and the job ends ...
    first = processes.torchrun("source_code.resilience.restart_train", *args, "--kill-at-step", kill_at,
                               "--attempt", 0, nproc=2, device="cpu", stream=False, timeout=120, check=False)
    if first.returncode == 0 or "simulated failure" not in first.stdout:
        raise processes.ProcessesFailed("the drill's job did not end with the kill:\n" + first.stdout[-2000:])
    if stream or (stream is None and processes.in_notebook()):
        print(f"restart run: rank 1 killed after step {kill_at}; torchrun ended the job "
              f"(exit status {first.returncode}); starting it again", flush=True)
    # ... and is started again from its snapshot, every worker, as a Slurm requeue would do
    processes.torchrun("source_code.resilience.restart_train", *args, "--kill-at-step", 0,
                       "--attempt", 1, nproc=2, device="cpu", stream=stream, timeout=120)
    events = {r: common.read_log(os.path.join(logs, f"rank_{r}.jsonl")) for r in range(2)}
    return {**recovery.restart_metrics(events), "events": events}


def compare(steps: int = 40, kill_at: int = 10, snapshot_every: int = 8, step_seconds: float = 0.05,
            failures_per_day: float = 1.0, workdir=None, stream=None) -> dict:
    workdir = workdir or tempfile.mkdtemp(prefix="resilience_")
    ft = ft_run.run(replicas=2, steps=steps, kill_at=kill_at, step_seconds=step_seconds,
                    workdir=workdir, stream=stream)
    restart = run_restart(steps, kill_at, snapshot_every, step_seconds, workdir, stream)
    mtbf_s = 86400 / failures_per_day
    interval_s = young_daly.daly_interval(restart["snapshot_seconds"], mtbf_s)
    found = sdc_drill.drill(flip_rank=1, at_step=5, more=((2, 3, "repeat"),))   # both kinds, one run
    return {"ft": ft, "restart": restart,
            "young_daly": {"snapshot_seconds": restart["snapshot_seconds"], "mtbf_seconds": mtbf_s,
                           "interval_seconds": interval_s,
                           "interval_steps": interval_s / restart["step_seconds"]},
            "sdc": found}


def summary_line(res: dict) -> str:
    ft, rs = res["ft"], res["restart"]
    return (f"summary: seconds_without_progress ft={ft['seconds_without_progress']:.2f} "
            f"restart={rs['seconds_without_progress']:.2f} final_loss ft={ft['final_loss']:.4f} "
            f"restart={rs['final_loss']:.4f} daly_interval_s={res['young_daly']['interval_seconds']:.1f} "
            f"ft_steps_lost={ft['steps_lost']} restart_steps_lost={rs['steps_lost']} "
            f"heal_bitwise_equal={int(ft['bitwise_equal'] and ft['healed_from_peer'])} "
            f"sdc_detected_rank={res['sdc']['detected_rank']}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--kill-at-step", type=positive_int, default=10)
    p.add_argument("--snapshot-every", type=positive_int, default=8)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--failures-per-day", type=float, default=1.0,
                   help="failure rate of the whole job, for Young/Daly's snapshot interval")
    p.add_argument("--out", default="", help="write every number as JSON here")
    args = p.parse_args(argv)
    if not args.kill_at_step < args.steps:
        raise LaunchError(f"error: --kill-at-step {args.kill_at_step} must be below --steps {args.steps}")
    if args.kill_at_step % args.snapshot_every == 0:
        raise LaunchError("error: --kill-at-step falls on a snapshot step, so a restart loses nothing; "
                          "pick a step between snapshots")
    if not (args.step_seconds >= 0 and args.failures_per_day > 0):
        raise LaunchError("error: --step-seconds must be >= 0 and --failures-per-day > 0")
    ft_run.require_torchft()
    res = compare(args.steps, args.kill_at_step, args.snapshot_every, args.step_seconds,
                  args.failures_per_day)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(summary_line(res))
    return 0


if __name__ == "__main__":
    run_main(main)
