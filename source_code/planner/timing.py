"""The planner's step-time model against a measured run: do ZeRO-1, 2 and 3 come in its order?

    python -m source_code.planner.timing            # 4 CPU processes, a few seconds

The planner ranks plans by an estimated step (search.Plan.step_s): FLOPs at a sustained rate,
plus the bytes each rank sends at a per-link bandwidth, nothing overlapped. Here 4 processes
(gloo) train a TransformerLM of a few million parameters with gradient accumulation over
``micro_batches`` micro-batches per step as ZeRO-1, ZeRO-2 (planner/accumulation.py) and
ZeRO-3 (FSDP2), the three interleaved ``repeats`` times; the median step of each is compared
with the planner's estimate for the same model and mesh, on a "cluster" whose two numbers are
measured in the same run: the FLOP/s of a forward + backward on every rank at once, and the
bandwidth of a reduce-scatter of the gradients. ``order_holds``: the measured steps come in the
planner's order (ZeRO-1 < ZeRO-2 < ZeRO-3, as its traffic grows with the micro-batches), the
measured order read from the CPU seconds each step cost the 4 processes together (every thread,
gloo's copies and sums included), each round's over that round's ZeRO-1 step, median over the
rounds. Wall time is printed beside it; it is not what the order is read from, because a busy
neighbour on the same cores stretches the wall clock of whichever step it lands on, not the work
the step makes the machine do.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from source_code.distributed import context
from source_code.workload import lm_loss
from source_code.planner.search import evaluate
from source_code.planner.spec import Cluster, Config, Model
from source_code import workload

DIM, LAYERS, HEADS = 256, 4, 4
ZEROS = (1, 2, 3)


def planner_model(seq: int) -> Model:
    """The planner's description of workload.model_config(dim=DIM, n_layers=LAYERS)."""
    cfg = workload.model_config(dim=DIM, n_layers=LAYERS, n_heads=HEADS)
    return Model("timed", layers=LAYERS, hidden=DIM, heads=HEADS, vocab=cfg["vocab_size"], seq=seq,
                 max_len=cfg["max_len"], fused_qkv=False)


def _build(zero: int, device):
    from source_code.mesh.tp import apply_fsdp
    from source_code.planner.accumulation import AccumulatingZero
    from torch.distributed.device_mesh import init_device_mesh
    model = workload.build_model(workload.model_config(dim=DIM, n_layers=LAYERS, n_heads=HEADS), 0, device)
    if zero == 3:
        model = apply_fsdp(model, init_device_mesh(device.type, (dist.get_world_size(),)))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, AccumulatingZero(model, stage=zero, lr=1e-4)


def _timed(fn) -> tuple[float, float]:
    """(wall s, CPU s of all ranks together) of ``fn``: the CPU seconds count every thread,
    gloo's included, so they are the work of the step, which a neighbour's load leaves alone."""
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    cpu = torch.tensor([time.process_time() - c0], dtype=torch.float64)
    dist.barrier()
    wall = time.perf_counter() - t0
    dist.all_reduce(cpu)
    return wall, float(cpu)


def measure_steps(micro_batches: int = 4, repeats: int = 3) -> dict:
    """On every rank (processes.spawn): median step per ZeRO stage, FLOP/s and bandwidth."""
    device = context().device
    world, rank = dist.get_world_size(), dist.get_rank()
    x, y = workload.global_batch(workload.sort_task(n=64), 0, world * micro_batches)
    xs, ys = (t.to(device) for t in workload.rank_slice((x, y), rank, world))
    count = int((y != -100).sum())
    runs = {z: _build(z, device) for z in ZEROS}

    def step(model, opt):
        for xm, ym in zip(xs.chunk(micro_batches), ys.chunk(micro_batches)):
            lm_loss(model(xm), ym, count).backward()
        opt.step()
        opt.zero_grad()

    plain = workload.build_model(workload.model_config(dim=DIM, n_layers=LAYERS, n_heads=HEADS), 0, device)
    grads = torch.zeros(sum(p.numel() for p in plain.parameters()), device=device)
    mine = grads.new_empty(grads.numel() // world)
    for model, opt in runs.values():                  # warm-up: allocations, FSDP's first gather
        step(model, opt)
    times, cpu = {z: [] for z in ZEROS}, {z: [] for z in ZEROS}
    compute, comm = [], []
    for _ in range(repeats):                          # interleaved: the same machine load for each
        for z in ZEROS:
            wall, work = _timed(lambda: step(*runs[z]))
            times[z].append(wall)
            cpu[z].append(work)
        compute.append(_timed(lambda: lm_loss(plain(xs[:1]), ys[:1], count).backward())[0])
        comm.append(_timed(lambda: dist.reduce_scatter_tensor(mine, grads))[0])
    model = planner_model(xs.shape[1])
    flops = statistics.median(compute)
    wire = (world - 1) / world * grads.numel() * grads.element_size()
    # each round's CPU seconds over that round's ZeRO-1 step, median over the rounds
    relative = {z: statistics.median(a / b for a, b in zip(t, cpu[ZEROS[0]])) for z, t in cpu.items()}
    return {"step_s": {z: statistics.median(t) for z, t in times.items()}, "relative": relative,
            "cpu_s": {z: statistics.median(t) for z, t in cpu.items()},
            "tflops": model.flops_per_token() * xs.shape[1] / flops / 1e12,
            "gbps": wire / statistics.median(comm) / 1e9, "world": world,
            "micro_batches": micro_batches, "seq": xs.shape[1]}


def predict(measured: dict) -> dict:
    """The planner's step (s) per ZeRO stage on a cluster with the measured FLOP/s and bandwidth."""
    w, m = measured["world"], measured["micro_batches"]
    cluster = Cluster(gpus=w, gpus_per_node=w, gpu_mem_gb=1e3, intra_gbps=measured["gbps"],
                      tflops=measured["tflops"])
    model = planner_model(measured["seq"])
    return {z: evaluate(model, Config(dp=w, zero=z, micro_batch=1, global_batch=w * m), cluster,
                        "fp32").step_s for z in ZEROS}


def compare(measured: dict) -> dict:
    """{"rows": [(zero, planned s, wall s, CPU s)], "order_holds", "predicted_order",
    "measured_order" (from the CPU seconds), "wall_order"}."""
    want, got = predict(measured), measured["step_s"]
    p_order = sorted(ZEROS, key=want.get)
    m_order = sorted(ZEROS, key=measured.get("relative", got).get)   # from the CPU seconds
    cpu = measured.get("cpu_s", {})
    return {"rows": [(z, want[z], got[z], cpu.get(z, float("nan"))) for z in ZEROS],
            "predicted_order": p_order, "measured_order": m_order,
            "wall_order": sorted(ZEROS, key=got.get), "order_holds": p_order == m_order}


def run(world_size: int = 4, micro_batches: int = 4, repeats: int = 3) -> tuple[dict, dict]:
    from source_code.processes import spawn
    measured = spawn(measure_steps, world_size, micro_batches, repeats, device="cpu")[0]
    return measured, compare(measured)


def format_lines(measured: dict, result: dict) -> list[str]:
    out = [f"measured here: {measured['tflops'] * 1e3:.2f} GFLOP/s per process (forward + backward), "
           f"{measured['gbps']:.2f} GB/s per process (reduce-scatter); {measured['world']} processes, "
           f"{measured['micro_batches']} micro-batches per step",
           f"{'ZeRO':>4s} {'planned s':>10s} {'wall s':>8s} {'CPU s':>7s}  (CPU s: all {measured['world']} processes together)"]
    out += [f"{z:4d} {p:10.4f} {m:8.4f} {c:7.4f}" for z, p, m, c in result["rows"]]
    out.append(f"order: planned {result['predicted_order']}, by CPU s {result['measured_order']}: "
               + ("the same" if result["order_holds"] else "DIFFERENT")
               + f" (by wall s {result.get('wall_order', result['measured_order'])})")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.micro_batches < 2 or args.repeats < 1:
        p.error("--micro-batches must be >= 2 and --repeats >= 1")
    measured, result = run(micro_batches=args.micro_batches, repeats=args.repeats)
    print("\n".join(format_lines(measured, result)))
    return 0 if result["order_holds"] else 1


if __name__ == "__main__":
    from source_code.errors import run_main   # a LaunchError: its one line, exit status 2
    run_main(main)
