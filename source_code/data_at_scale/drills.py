"""The loops of loops.py on real processes (``processes.spawn``, gloo on the CPU), watched from
outside: the batches are wrapped to count what each rank took, the steps' ids are recorded by a
hook, and a hang ends in a short collective timeout with one line per rank.

* ``uneven``: whole shards per rank (WebDataset's ``split_by_node``) under plain DDP: the ranks
  with fewer shards finish first and wait at the epoch's end while the others wait in DDP's
  all-reduce; each rank reports where it stopped (``diagnose`` makes the one line);
* ``join_and_pad``: the same shards under ``Join``, then the epoch split by sample and padded,
  each with a collective timeout of a minute, so that "hang" is measured at the epoch's barrier;
  under ``Join`` the optimizer states are compared before and after ``loops.sync_optimizer``,
  and what one more step on every rank does to the weights in each case; then each run's
  weights against one process on the same global batches (``parity.one_process``);
* ``resume``: the global cursor's loop for ``stop_after`` steps (or to the epoch's end) from
  the snapshot, if there is one; a snapshot with the cursor at the end.

Data: every rank reads the tar shards with WebDataset; the DDP model is model.build's.
"""
from __future__ import annotations

import copy
import os
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import checkpoint
from source_code.distributed import cleanup
from source_code.profiling.hang import clean
from source_code.data_at_scale import cursor as cur, loops, model as mdl, parity
from source_code.data_at_scale.formats import as_array, load_shards


class Taken:
    """The batches of a list of ids, recording the ids of each batch the loop has taken."""

    def __init__(self, samples, ids: list[int], batch: int):
        self.samples, self.ids, self.batch, self.given = samples, ids, batch, []

    @property
    def taken(self) -> int:
        return len(self.given)

    def trained(self, steps: int) -> list[int]:
        """The ids of the first ``steps`` batches taken (pads left out): what those steps trained."""
        return [i for ids in self.given[:steps] for i in ids if i != cur.PAD]

    def __len__(self) -> int:
        return cur.steps(self.ids, self.batch)

    def __iter__(self):
        for start in range(0, len(self.ids), self.batch):
            self.given.append(self.ids[start:start + self.batch])
            yield mdl.collate(self.samples, self.given[-1])


def _ddp(seed: int):
    model = DDP(parity.build(seed)[0])                   # small: the lesson is the data
    return model, torch.optim.AdamW(model.parameters(), lr=parity.LR)


def _set_timeout(seconds: float) -> None:
    """The default group's collective timeout from now on (torch 2.6 has only the private name)."""
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    setter(timedelta(seconds=seconds))


def _stopped_in(exc: BaseException) -> str:
    """Where the loop was when ``exc`` came, read from its traceback: in a step or at the barrier."""
    frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
    if "run_batches" in frames:
        return "step"
    return "barrier" if any(name.startswith("train_epoch") for name in frames) else "elsewhere"


def _epoch_by_shard(urls, shards, batch, seed, joined: bool, timeout_s: float | None = None):
    """One epoch of whole shards per rank: (what happened, the DDP model, its optimizer)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    found = load_shards(urls, split=True)                       # this rank's shards, read by WebDataset
    mine = cur.by_shard(shards, rank, world)
    assert sorted(found) == sorted(mine), "split_by_node and by_shard disagree"
    batches = Taken(as_array(found, sum(map(len, shards))), mine, batch)
    model, opt = _ddp(seed)                  # DDP's first broadcast: every rank is here
    if timeout_s is not None:
        _set_timeout(timeout_s)              # the short timeout counts from here, not from the start
    out = {"rank": rank, "batches": len(batches)}
    start = time.perf_counter()
    try:
        if joined:   # the optimizer left as Join leaves it: compared, then synced, in join_and_pad
            out["steps"] = loops.train_epoch_joined(model, opt, batches, resync_optimizer=False)
        else:
            out["steps"] = loops.train_epoch(model, opt, batches)
        out["hang"] = False
    except Exception as exc:  # DistBackendError / RuntimeError: the timeout, or a peer that left
        where = _stopped_in(exc)
        out.update(hang=True, steps=batches.taken - (where == "step"),
                   error=f"{type(exc).__name__}: {clean(str(exc))[:160]}",
                   where={"step": f"DDP's gradient all-reduce of step {batches.taken}",
                          "barrier": "the barrier at the epoch's end"}.get(where, "an unknown place"))
    out["ids"] = batches.trained(out["steps"])   # what the completed steps trained
    out["given"] = batches.given[:out["steps"]]  # the batches of those steps, pads included
    out["seconds"] = time.perf_counter() - start
    return out, model, opt


def uneven(urls, shards, batch: int, timeout_s: float, seed: int = 0) -> dict:
    """Spawned: plain DDP on whole shards per rank, with a collective timeout of ``timeout_s`` set
    once every rank has built its DDP model (a loaded machine may start them seconds apart)."""
    out, _, _ = _epoch_by_shard(urls, shards, batch, seed, joined=False, timeout_s=timeout_s)
    if out["hang"]:
        cleanup(barrier=False)   # a broken group: tear it down here, no barrier
    return out


# the Join and padded epochs' collective timeout: a hang (a rank that runs out first) ends in a
# minute with its report, not in the group's default minutes; a minute is far beyond any rank's
# delay on a loaded machine, so a timeout here is a hang, not a slow rank
FIXED_TIMEOUT_S = 60.0


def _epoch_padded(samples, batch: int, seed: int, timeout_s: float):
    """One epoch split by sample and padded, under plain DDP: (what happened, model)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = cur.by_sample(cur.epoch_order(len(samples), 0, seed), rank, world, fix="pad")
    batches = Taken(samples, ids, batch)
    model, opt = _ddp(seed)
    _set_timeout(timeout_s)
    out = {"rank": rank, "batches": len(batches)}
    try:
        out.update(steps=loops.train_epoch(model, opt, batches), hang=False)   # the barrier passed
    except Exception as exc:  # the timeout: some rank never came to the barrier
        out.update(hang=True, steps=batches.taken, error=f"{type(exc).__name__}: {clean(str(exc))[:160]}")
    out.update(ids=batches.trained(out["steps"]), given=batches.given[:out["steps"]],
               params=parity.flat(model.parameters()).numpy())
    return out


def join_and_pad(urls, shards, batch: int, seed: int = 0, timeout_s: float = FIXED_TIMEOUT_S) -> dict:
    """Spawned: whole shards per rank under Join, then the epoch split by sample and padded, each
    with a collective timeout of ``timeout_s``: "hang" says whether its epoch-end barrier passed."""
    samples = as_array(load_shards(urls))
    joined, model, opt = _epoch_by_shard(urls, shards, batch, seed, joined=True, timeout_s=timeout_s)
    joined["params"] = parity.flat(model.parameters()).numpy()
    if joined["hang"]:
        cleanup(barrier=False)
        return {"joined": joined, "padded": None, "one_process": None}
    joined.update(_optimizer_after_join(model, opt, joined["steps"], samples, joined["given"][0]))
    padded = _epoch_padded(samples, batch, seed, timeout_s)
    if padded["hang"]:
        cleanup(barrier=False)
        return {"joined": joined, "padded": padded, "one_process": None}
    return {"joined": joined, "padded": padded, "one_process": _against_one_process(samples, joined, padded)}


# (run, how the one process weighs the samples): as the run should, and the other way
CHECKS = [("joined", {}), ("joined", {"divide_by_initial_world": False}),
          ("padded", {}), ("padded", {"pads_weigh_zero": False})]


def _against_one_process(samples, joined: dict, padded: dict) -> dict:
    """Each run's weights against one process on the same global batches (parity.one_process),
    the checks of CHECKS shared out among the ranks: {"joined": largest difference, ...,
    "joined_weighed_otherwise": ...}, the same dict on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = [None] * world
    dist.all_gather_object(batches, {"joined": joined["given"], "padded": padded["given"]})
    mine = {}
    for k in range(rank, len(CHECKS), world):
        run, how = CHECKS[k]
        ref = parity.one_process(samples, [b[run] for b in batches], world, **how)
        params = joined["params"] if run == "joined" else padded["params"]   # every rank's the same
        mine[run + ("_weighed_otherwise" if how else "")] = float(abs(ref - params).max())
    every = [None] * world
    dist.all_gather_object(every, mine)
    return {key: value for part in every for key, value in part.items()}


def _optimizer_after_join(model, opt, steps: int, samples, ids: list[int]) -> dict:
    """The ranks' optimizer states as Join leaves them, then after ``loops.sync_optimizer``; and
    in each case how far apart the ranks' weights are after one more step on every rank."""
    def one_more_step() -> float:
        loss = mdl.weighted_loss(model, *mdl.collate(samples, ids))
        opt.zero_grad()
        loss.backward()                      # every rank takes part: the same averaged gradient
        opt.step()
        return parity.spread(model.parameters())

    state, count = parity.optimizer_state(opt)
    out = {"optimizer_steps": count, "optimizer_spread": parity.spread(state)}
    saved = copy.deepcopy(model.module.state_dict()), copy.deepcopy(opt.state_dict())
    out["weights_spread"] = one_more_step()
    model.module.load_state_dict(saved[0])
    opt.load_state_dict(saved[1])
    loops.sync_optimizer(opt, steps)
    state, count = parity.optimizer_state(opt)
    out.update(optimizer_steps_synced=count, optimizer_spread_synced=parity.spread(state),
               weights_spread_synced=one_more_step())
    return out


def hang_at_the_end(reports: list[dict]) -> bool:
    """Whether the hang is the uneven shards' one: every rank timed out, the ranks with the fewest
    batches in the barrier, every rank after the shortest rank's last step."""
    fewest = min(r["batches"] for r in reports)
    return (all(r["hang"] for r in reports)
            and {r["rank"] for r in reports if r["where"].startswith("the barrier")}
            == {r["rank"] for r in reports if r["batches"] == fewest}
            and all(r["steps"] == fewest for r in reports))


def diagnose(reports: list[dict], timeout_s: float) -> list[str]:
    """One line per rank, then the verdict, in the style of notebook 15's hang drill (the timeout:
    the one the reports say their run had, else ``timeout_s``)."""
    timeout_s = reports[0].get("timeout_s", timeout_s) if reports else timeout_s
    lines = [f"[rank {r['rank']}] {r['batches']} batches, {r['steps']} steps done, waiting in {r['where']}: "
             f"{r['error']}" for r in sorted(reports, key=lambda r: r["rank"]) if r["hang"]]
    early = sorted(r["rank"] for r in reports if r["hang"] and r["where"].startswith("the barrier"))
    late = sorted(r["rank"] for r in reports if r["hang"] and not r["where"].startswith("the barrier"))
    if early and late:
        lines.append(f"hang detected: rank(s) {early} ran out of batches and wait at the epoch's end while "
                     f"rank(s) {late} wait in DDP's all-reduce for them; the {timeout_s:g} s collective "
                     f"timeout ended it")
    return lines


def resume(urls, ckpt: str, global_batch: int, stop_after: int | None, seed: int = 0) -> dict:
    """Spawned: the cursor's loop from the snapshot at ``ckpt`` (when there is one), then a snapshot."""
    rank, world = dist.get_rank(), dist.get_world_size()
    samples = as_array(load_shards(urls))
    cursor = cur.GlobalCursor(len(samples), global_batch, seed)
    model, opt = _ddp(seed)
    if os.path.exists(ckpt):
        cursor.load_state_dict(checkpoint.load_snapshot(ckpt, model, opt)["extra"]["cursor"])
    start = dict(cursor.state_dict())
    steps = []   # the ids each step trained on this rank (pads left out)
    loops.train_from_cursor(model, opt, cursor, samples, rank, world, stop_after,
                            on_step=lambda ids: steps.append([i for i in ids if i != cur.PAD]))
    checkpoint.save_snapshot(ckpt, model, opt, cursor.epoch, extra={"cursor": cursor.state_dict()})
    return {"rank": rank, "world": world, "start": start, "end": cursor.state_dict(), "steps": steps}


def count(ids: list[int], n: int) -> dict:
    """repeated (seen more than once, counted per extra time) and missing ids of an epoch of n."""
    unique = set(ids)
    return {"seen": len(ids), "unique": len(unique), "repeated": len(ids) - len(unique),
            "missing": n - len(unique & set(range(n)))}
