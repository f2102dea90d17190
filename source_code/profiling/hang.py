"""A hang made on purpose, and caught: one rank skips an all-reduce; a short timeout reports it.

    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.hang --timeout 5
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node=2 -m source_code.profiling.hang
    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.hang --fixed     # no hang

The loop below is the bug: at step ``--skip-at`` rank 1 has no data and ``continue``s past the
all-reduce that rank 0 makes. Every later all-reduce of rank 0 pairs with the NEXT one of rank 1
(same shapes: nothing notices), until rank 0's last all-reduce has no partner and waits, while
rank 1 waits in the barrier. Without a timeout that wait lasts 30 minutes (gloo's default; NCCL's
is 10): here ``--timeout`` seconds, then each rank reports, dumps its flight recorder
(TORCH_FR_BUFFER_SIZE) and writes what it saw (result_rankN.json), and rank 0 compares the
dumps. The process exits 0 when the drill went
as designed (the summary says hang_detected=1); a real job would stop with an error there. The
summary's mismatch_at is the recorders' first mismatched collective, counted from 1; 0 says
they show none (they agree, or nothing was dumped).

The drill runs on the CPU with gloo on every machine, also inside a GPU job: ``main`` sets
``WORKSHOP_DEVICE=cpu`` (the device policy's own switch) before the group forms, and says so
in one line where a GPU is visible. On purpose, because on a GPU node the policy's group is
``cpu:gloo,cuda:nccl`` and the drill would not show what it is meant to show:

* its all-reduces use CPU tensors (gloo), but ``dist.barrier()`` on that group goes through
  NCCL: the two ranks would wait in two different backends, and NCCL's watchdog ends the
  process at the timeout (an abort: no exception, no report, no dump);
* NCCL collectives return as soon as they are queued (unless TORCH_NCCL_BLOCKING_WAIT=1): the
  skipped all-reduce would never raise in Python, where the drill catches and reports it;
* ``flight_recorder.dump()`` reads gloo's recorder; NCCL keeps its own (``dump("nccl")``).

What it teaches (one rank skips a collective, a timeout, DETAIL, comparing recorders) is the
same on NCCL; the NCCL-specific tools (TORCH_NCCL_DUMP_ON_TIMEOUT, the watchdog) are described
in notebook 15.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from source_code.cli import Parser, nonnegative_int, positive_float, positive_int, writable_path
from source_code.distributed import cleanup, ranks_from_env, run_main, setup
from source_code import torch_versions
from source_code.profiling import flight_recorder

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.profiling.hang"
ON_CPU = ("note: the hang drill runs with gloo on cpu on purpose (WORKSHOP_DEVICE=cpu), not on the "
          "GPUs: there its barrier would go through NCCL, whose watchdog aborts a rank instead of "
          "raising (see the docstring of source_code/profiling/hang.py)")


def pin_to_cpu() -> str:
    """Make the device policy choose CPU + gloo for this drill (why: the module docstring).
    Returns the line to print where that overrides a GPU, else ''."""
    os.environ["WORKSHOP_DEVICE"] = "cpu"  # read by device_policy.choose when the group forms
    return ON_CPU if torch.cuda.is_available() else ""


def training_loop(steps: int, skip_at: int, fixed: bool, numel: int = 1000) -> int:
    """The gradient all-reduce of a data-parallel loop; returns how many this rank made."""
    rank, made = dist.get_rank(), 0
    for step in range(steps):
        n_local = 0 if (rank == 1 and step == skip_at) else 16  # rank 1's shard ran out here
        grad = torch.ones(numel) * n_local
        if n_local == 0 and not fixed:
            continue                 # BUG: the other ranks all-reduce without this one
        dist.all_reduce(grad)        # fixed: join with a zero gradient (weights by n_local)
        made += 1
    dist.barrier()                   # end of the epoch: everyone meets here
    return made


def clean(message: str) -> str:
    """The error's first line without the C++ source location and tensor-option noise."""
    first = message.strip().splitlines()[0] if message.strip() else message
    first = re.sub(r"\[[^\]]*\.(cc|cpp):\d+\]\s*", "", first)
    first = re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\(nullopt\)\)", "", first)
    return first.split("Collectives differ in the following aspects")[0].strip()


FINGERPRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+),?\s*OpType=(\w+)")


def fingerprints(message: str) -> list[dict]:
    """The operations a DETAIL mismatch message names, in its order: first this rank's own, then
    what it says of the other rank: [{"rank", "seq", "op"}, ...] ([] for any other message).
    Only the first can be trusted: the second is decoded from what the check exchanged, and in
    the drill it names an operation (seq 0, GATHER or REDUCE) that the other rank did not run."""
    return [{"rank": int(r), "seq": int(n), "op": op} for r, n, op in FINGERPRINT.findall(message)]


def drill(args) -> dict:
    ctx = setup(launch_hint=LAUNCH, timeout_s=args.timeout)
    start = time.perf_counter()
    out = {"rank": ctx.rank, "world_size": ctx.world_size, "debug": os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF")}
    try:
        out["made"] = training_loop(args.steps, args.skip_at, args.fixed)
        out["hang"] = False
    except Exception as exc:  # DistBackendError / RuntimeError: timeout or detected mismatch
        out.update(hang=True, error=clean(str(exc)), error_type=type(exc).__name__,
                   fingerprints=fingerprints(str(exc)))
    out["seconds"] = time.perf_counter() - start
    fr = flight_recorder.dump()
    Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
    if fr is not None:
        (Path(args.trace_dir) / f"fr_rank{ctx.rank}.json").write_text(json.dumps(fr))
    (Path(args.trace_dir) / f"result_rank{ctx.rank}.json").write_text(json.dumps(out))  # for the notebook
    cleanup(barrier=not out["hang"])  # a broken group: no barrier, just tear it down
    return out


def gather_dumps(trace_dir: str, world: int, wait_s: float) -> dict[int, dict]:
    """Rank 0 reads every rank's dump file (the group is broken: files are the way)."""
    deadline = time.monotonic() + wait_s
    paths = {r: Path(trace_dir) / f"fr_rank{r}.json" for r in range(world)}
    while not all(p.exists() for p in paths.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # let the last writer finish
    return {r: json.loads(p.read_text()) for r, p in paths.items() if p.exists()}


def recorder_report(dumps: dict[int, dict], stopped_by_detail: bool) -> str:
    """The recorders' report; under DETAIL their agreement is no clue to a slow rank: DETAIL
    stopped every rank before the mismatched call ran, so no recorder holds that call."""
    text = flight_recorder.report(dumps)
    if not stopped_by_detail or flight_recorder.first_mismatch(dumps) is not None:
        return text
    kept = [ln for ln in text.splitlines() if "recorders agree" not in ln]
    return "\n".join(kept + ["  the recorders agree because DETAIL stopped the ranks before the mismatched call "
                              "ran (it is in no recorder): the mismatch error above names each rank's call"])


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=positive_float, default=5.0, help="process-group timeout in seconds")
    p.add_argument("--steps", type=positive_int, default=6)
    p.add_argument("--skip-at", type=nonnegative_int, default=2, help="the step where rank 1 skips")
    p.add_argument("--fixed", action="store_true", help="run the repaired loop")
    p.add_argument("--trace-dir", type=writable_path, default="traces", help="flight-recorder dumps")
    args = p.parse_args(argv)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")  # before the group starts
    note = pin_to_cpu()
    torch.set_num_threads(1)
    if note and (ranks_from_env() or (0,))[0] == 0:
        print(note, flush=True)
    if (ranks_from_env() or (0,))[0] == 0:  # old dumps would be read as this run's
        for stale in [*Path(args.trace_dir).glob("fr_rank*.json"), *Path(args.trace_dir).glob("result_rank*.json")]:
            stale.unlink(missing_ok=True)
    r = drill(args)
    if r["hang"]:  # every rank says what it saw, in one write (lines of 2 ranks must not mix)
        sys.stdout.write(f"[rank {r['rank']}] stopped after {r['seconds']:.1f} s ({r['error_type']}): "
                         f"{r['error']}\n")
        sys.stdout.flush()
    if r["rank"] != 0:
        return 0
    dumps = gather_dumps(args.trace_dir, r["world_size"], args.timeout + 10) if r["hang"] else {}
    if dumps and not torch_versions.supported("flight-recorder", "cpu"):  # empty: "agree" would mislead
        dumps = {}
        print("flight recorder: " + torch_versions.refusal("flight-recorder").removeprefix("error: "))
    if r["hang"]:
        if "mismatch" in r["error"]:
            print(f"hang detected: TORCH_DISTRIBUTED_DEBUG={r['debug']} compared the ranks' next "
                  "collectives before running them, and they differ")
        else:
            print(f"hang detected: a collective did not complete within {args.timeout:g} s "
                  f"(TORCH_DISTRIBUTED_DEBUG={r['debug']})")
        print("flight recorder:" if dumps else f"flight recorder: {flight_recorder.unavailable_reason()}")
        if dumps:
            print(recorder_report(dumps, stopped_by_detail="mismatch" in r["error"]))
    else:
        print(f"no hang: rank 0 made {r['made']} all-reduces in {r['seconds']:.1f} s")
    mm = flight_recorder.first_mismatch(dumps) if dumps else None
    print(f"summary: world_size={r['world_size']} hang_detected={int(r['hang'])} "
          f"seconds={r['seconds']:.1f} mismatch_at={mm['index'] if mm else 0}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
