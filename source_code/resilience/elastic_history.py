"""What an elastic run did, read from its workers' step logs (elastic_train.py writes them).

* ``read(log_dir)``: every worker's start and step events;
* ``summarise``: the worlds in order, the restart count each start saw, and the samples of the
  run's *history*: the steps of each world up to where the next world resumed (a step a kill
  undid was computed, then computed again from the checkpoint: it is counted as recomputed,
  not as seen). Exactly once: seen == unique == the epoch's full batches;
* ``reference_loss``: the same global batches on one process with no failure, for comparison.

    python -m source_code.resilience.elastic_history LOG_DIR     # the summary line of a finished run
    python -m source_code.resilience.elastic_history LOG_DIR --pids-on HOST   # a node's agent and workers
"""
from __future__ import annotations

import glob
import os
import sys

from source_code import workload
from source_code.resilience import common
from source_code.resilience.reshard import EpochPosition


def read(log_dir: str) -> dict:
    events = [e for path in sorted(glob.glob(os.path.join(log_dir, "worker_*.jsonl")))
              for e in common.read_log(path)]
    events.sort(key=lambda e: e["t"])
    return {kind: [e for e in events if e["event"] == kind] for kind in ("start", "step", "end")}


def summarise(events: dict, samples: int, batch_size: int) -> dict:
    """``worlds``: in order, each one's size, where it resumed and ``restarts``: {agent pid: the
    restart count its worker was started with}; the history's sample counts; the final loss."""
    worlds = {}
    for start in events["start"]:                                   # in time order
        w = worlds.setdefault(_world_key(start), {"size": start["world"], "resumed_at": start["resumed_at"],
                                                  "restarts": {}})
        w["restarts"][start["agent"]] = start["attempt"]
    order = list(worlds)
    history, computed = [], 0
    for i, key in enumerate(order):
        until = worlds[order[i + 1]]["resumed_at"] if i + 1 < len(order) else samples
        steps = [e for e in events["step"] if _world_key(e) == key]
        computed += sum(len(e["samples"]) for e in steps)
        history += [x for e in steps if e["consumed"] <= until for x in e["samples"]]
    ends = events["end"]
    return {"worlds": [worlds[k] for k in order],
            "seen": len(history), "unique": len(set(history)), "recomputed": computed - len(history),
            "expected": samples // batch_size * batch_size,
            "final_loss": ends[-1]["eval_loss"] if ends else float("nan")}


def _world_key(event: dict) -> tuple:
    """Which world an event belongs to: each rendezvous round gives its workers a new store port."""
    return event["world"], event["master_port"]


def reference_loss(samples: int, batch_size: int) -> float:
    """The run without failures: the same global batches, in order, on one process."""
    dataset = common.task(samples)
    model, optimizer = common.build(0)
    position = EpochPosition(len(dataset), batch_size)
    x_all, y_all = dataset.tensors
    for _ in range(samples // batch_size):
        idx = position.next_indices(0, 1)
        optimizer.zero_grad()
        workload.loss_fn(model, x_all[idx], y_all[idx]).backward()
        optimizer.step()
    return common.eval_loss(model, dataset)


def main(argv=None) -> int:
    """Exit status 0 only when every sample of the epoch is in the run's history exactly once."""
    argv = sys.argv[1:] if argv is None else argv
    events = read(argv[0])
    if len(argv) == 3 and argv[1] == "--pids-on":
        print(" ".join(sorted({str(p) for s in events["start"] if s.get("host") == argv[2]
                               for p in (s["pid"], s["agent"])})))
        return 0
    if not events["end"]:
        print(f"error: no finished run in {argv[0]} (no end event)", file=sys.stderr)
        return 1
    end = events["end"][-1]
    r = summarise(events, end["samples"], end["batch_size"])
    once = r["seen"] == r["unique"] == r["expected"]
    print(f"summary: worlds={','.join(str(w['size']) for w in r['worlds'])} recomputed={r['recomputed']} "
          f"seen={r['seen']} unique={r['unique']} expected={r['expected']} exactly_once={int(once)}")
    return 0 if once else 1


if __name__ == "__main__":
    sys.exit(main())
