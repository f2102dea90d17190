"""Own tensor parallelism vs the library's (DTensor): same numbers, same collectives, step times.

    torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.compare
    torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.compare --sequence-parallel --steps 40

* ``library_parity``: dense, own TP and DTensor TP on the same batch; max diffs of logits,
  loss and gradients, DTensor vs dense and vs own; collectives of one step counted by our
  ledger (own) and by ``CommDebugMode`` (DTensor), forward and backward separately.
* ``step_times``: own and DTensor training steps (forward, backward, SGD) alternating in one
  run, each timed between barriers (and a CUDA synchronize on a GPU); the median ratio own / DTensor.

Both compute on this rank's device (``distributed.context().device``): the CPU when notebook
11 spawns them with ``device="cpu"``, one GPU per process under torchrun on a GPU node, where
the DTensor mesh is a CUDA mesh, TF32 is off and the parity tolerance is
``harness.tolerance`` (1e-5 on the CPU, 1e-4 on CUDA).
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.distributed as dist

from source_code.cli import Parser, positive_int
from source_code.distributed import context, print0, run_main, session
from source_code.tensor_parallel import comm, dtensor
from source_code.tensor_parallel.harness import Workload, lm_loss, max_diff, on_device, tolerance
from source_code.tensor_parallel.model import TPTransformerLM, dense_slice

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.compare"
TIMING = Workload(vocab=64, dim=128, heads=8, layers=2, seq=64, batch=8)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _mine(t):
    """A DTensor gradient as this rank's own TP holds it: my shard of a sharded parameter, the
    whole (reduced) tensor of a replicated one."""
    if not hasattr(t, "placements"):
        return t
    return t.to_local() if any(p.is_shard() for p in t.placements) else t.full_tensor()


def _as_own(grad, own_param):
    """The library's gradient cut like our parameter (our token table may be vocabulary-split
    where the library's plan keeps it replicated)."""
    g = _mine(grad)
    return g if g.shape == own_param.shape else dense_slice(_full(grad), own_param)


def _short(op) -> str:
    """'c10d_functional.all_reduce' / torch op objects -> 'all_reduce'."""
    name = str(op).split(".")[-1] if "." in str(op) else str(op)
    for short in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        if short in str(op):
            return short
    return name


def _counts(mode) -> dict:
    out = {}
    for op, n in mode.get_comm_counts().items():
        out[_short(op)] = out.get(_short(op), 0) + n
    return out


def build_library(dense, sequence_parallel: bool, vocab_parallel_head: bool = False,
                  shared_input: bool = True):
    """A DTensor copy of ``dense`` on a 1-D mesh of this job's device type (cpu or cuda)."""
    mesh = dtensor.init_device_mesh(context().device.type, (dist.get_world_size(),))
    return dtensor.parallelize(copy.deepcopy(dense), mesh, sequence_parallel, vocab_parallel_head,
                               shared_input)


def library_parity(work: Workload, sequence_parallel: bool = False,
                   vocab_parallel_head: bool = False, shared_input: bool = True) -> dict:
    """Run on every rank: dense vs own vs DTensor, one forward + backward, collectives counted."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dense, x, y = on_device(work)
    ref_logits = dense(x)
    ref_loss = lm_loss(ref_logits, y)
    ref_loss.backward()

    own = TPTransformerLM(dense, rank, world, sequence_parallel, vocab_parallel=vocab_parallel_head)
    with comm.counting() as ledger:
        own_loss = own.loss(own(x), y)
        own_loss.backward()
        own.sync_sp_grads()

    lib = build_library(dense, sequence_parallel, vocab_parallel_head, shared_input)
    with dtensor.loss_context(vocab_parallel_head):
        with dtensor.CommDebugMode() as fwd:
            logits = lib(x)
            loss = lm_loss(logits, y)
        with dtensor.CommDebugMode() as bwd:
            loss.backward()
    placements = {n: str(getattr(p.grad, "placements", "plain tensor")) for n, p in lib.named_parameters()}
    with dtensor.CommDebugMode() as opt_mode:  # Partial gradients are summed when the step reads them
        torch.optim.SGD(lib.parameters(), lr=0.1).step()
    dense_params, own_params = dict(dense.named_parameters()), dict(own.named_parameters())
    lib_vs_dense = max(max_diff(_full(p.grad), dense_params[n].grad) for n, p in lib.named_parameters())
    lib_vs_own = max(max_diff(_as_own(p.grad, own_params[n]), own_params[n].grad)
                     for n, p in lib.named_parameters())
    return {"rank": rank, "world": world,
            "logits_diff": max_diff(_full(logits), ref_logits), "loss_diff": max_diff(_full(loss), ref_loss),
            "grad_diff": lib_vs_dense, "grad_diff_vs_own": lib_vs_own,
            "own_loss_diff": max_diff(own_loss, ref_loss),
            "lib_forward": _counts(fwd), "lib_backward": _counts(bwd),
            "lib_optimizer": _counts(opt_mode),
            "own_forward": {op: ledger.count(op, "forward") for op, ph in ledger.table() if ph == "forward"},
            "own_backward": {op: ledger.count(op, "backward") for op, ph in ledger.table() if ph == "backward"},
            "own_table": ledger.table(), "grad_placements": placements,
            "device": x.device.type, "tol": tolerance(x.device)}


def library_report(work: Workload) -> dict:
    """Run on every rank: library_parity of TP, of TP + SP, and of TP with a vocabulary-parallel
    head under loss_parallel; the TP plan also without the shared attention input."""
    return {"tp": library_parity(work, False), "sp": library_parity(work, True),
            "loss_parallel": library_parity(work, False, True),
            "unshared": library_parity(work, False, shared_input=False)}


def _step(model, opt, x, y, own: bool):
    opt.zero_grad(set_to_none=True)
    loss = lm_loss(model(x), y)
    loss.backward()
    if own:
        model.sync_sp_grads()
    opt.step()


def _wait(device) -> None:
    """Everyone's work done: this GPU's queued kernels, then every rank (a barrier)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def step_times(work: Workload = TIMING, steps: int = 20, sequence_parallel: bool = False,
               warmup: int = 3) -> dict:
    """Run on every rank: own and DTensor steps alternating; per-step seconds and the median ratio."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dense, x, y = on_device(work)
    models = {"own": TPTransformerLM(dense, rank, world, sequence_parallel),
              "dtensor": build_library(dense, sequence_parallel)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
    times = {k: [] for k in models}
    for i in range(warmup + steps):
        for k in (("own", "dtensor") if i % 2 == 0 else ("dtensor", "own")):  # alternate who goes first
            _wait(x.device)
            t0 = time.perf_counter()
            _step(models[k], opts[k], x, y, own=k == "own")
            _wait(x.device)
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
    ratios = [a / b for a, b in zip(times["own"], times["dtensor"])]
    return {"rank": rank, "own": times["own"], "dtensor": times["dtensor"],
            "median_own": statistics.median(times["own"]),
            "median_dtensor": statistics.median(times["dtensor"]),
            "median_ratio": statistics.median(ratios)}


def main(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=20)
    ap.add_argument("--sequence-parallel", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        par = library_parity(Workload(), args.sequence_parallel)
        worst = max(par["logits_diff"], par["loss_diff"], par["grad_diff"], par["grad_diff_vs_own"])
        print0(f"parity on {ctx.device.type}: DTensor vs dense logits {par['logits_diff']:.2e} grads "
               f"{par['grad_diff']:.2e}, vs own grads {par['grad_diff_vs_own']:.2e} (tol {par['tol']:g}"
               f"{', TF32 off' if ctx.device.type == 'cuda' else ''})")
        print0(f"collectives forward: own {par['own_forward']} DTensor {par['lib_forward']}")
        print0(f"collectives backward: own {par['own_backward']} DTensor {par['lib_backward']}"
               f" + {par['lib_optimizer']} in the optimizer step")
        t = step_times(TIMING, args.steps, args.sequence_parallel)
        print0(f"step time median: own {t['median_own'] * 1e3:.1f} ms, DTensor "
               f"{t['median_dtensor'] * 1e3:.1f} ms, own/DTensor {t['median_ratio']:.2f} "
               f"({args.steps} interleaved steps, {ctx.world_size} ranks)")
    return 0 if worst <= par["tol"] else 1


if __name__ == "__main__":
    run_main(main)
