"""The collectives of torch.distributed, each run on several processes with inputs and outputs shown.

all_reduce, all_gather, reduce_scatter, broadcast and reduce on small integer tensors (rank r
starts with [10r, 10r+1, ...]) so that every output can be checked by hand; and all-reduce
computed a second way, as reduce-scatter followed by all-gather.

    python -m source_code.sync.collectives          # 4 processes, prints one table per collective
"""
from __future__ import annotations

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def _input(rank: int, world: int) -> torch.Tensor:
    return torch.arange(world, dtype=torch.int64) + 10 * rank


def run_collectives() -> dict:
    """Run on every rank: {collective: (input list, output list or None where undefined)}."""
    from source_code.distributed import context
    rank, world = dist.get_rank(), dist.get_world_size()
    device = context().device
    x = _input(rank, world).to(device)
    out = {}

    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)                   # everyone gets the elementwise sum
    out["all_reduce"] = (x.tolist(), t.tolist())

    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)                                   # everyone gets everyone's tensor
    out["all_gather"] = (x.tolist(), [p.tolist() for p in parts])

    mine = torch.empty(1, dtype=x.dtype, device=device)
    dist.reduce_scatter(mine, list(x.chunk(world)), op=dist.ReduceOp.SUM)  # rank r: sum of element r
    out["reduce_scatter"] = (x.tolist(), mine.tolist())

    t = x.clone()
    dist.broadcast(t, src=0)                                    # everyone gets rank 0's tensor
    out["broadcast"] = (x.tolist(), t.tolist())

    t = x.clone()
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)                 # only rank 0's result is defined
    out["reduce"] = (x.tolist(), t.tolist() if rank == 0 else None)

    # all-reduce = reduce-scatter (each rank sums one chunk) + all-gather (hand the chunks round)
    y = torch.randn(world * 3, generator=torch.Generator().manual_seed(rank), dtype=torch.float64).to(device)
    chunk = torch.empty(3, dtype=y.dtype, device=device)
    dist.reduce_scatter(chunk, list(y.chunk(world)), op=dist.ReduceOp.SUM)
    gathered = [torch.empty_like(chunk) for _ in range(world)]
    dist.all_gather(gathered, chunk)
    two_step = torch.cat(gathered)
    reference = y.clone()
    dist.all_reduce(reference, op=dist.ReduceOp.SUM)
    out["rs_plus_ag_diff"] = float((two_step - reference).abs().max())
    out["rs_plus_ag_first"] = (two_step[:3].tolist(), reference[:3].tolist())
    return out


def expected(name: str, rank: int, world: int):
    """What the collective must return on ``rank``, computed by hand from the inputs."""
    inputs = [_input(r, world).tolist() for r in range(world)]
    total = [sum(col) for col in zip(*inputs)]
    return {"all_reduce": total, "all_gather": inputs, "reduce_scatter": [total[rank]],
            "broadcast": inputs[0], "reduce": total if rank == 0 else None}[name]


def table(results: list, name: str) -> str:
    """Rank | input | output, one line per rank, for one collective."""
    lines = [f"{name}:", f"  {'rank':>4}  {'input':<18} output"]
    for r, res in enumerate(results):
        inp, outp = res[name]
        lines.append(f"  {r:>4}  {str(inp):<18} {'(undefined: not the destination)' if outp is None else outp}")
    return "\n".join(lines)


def main():
    from source_code.processes import spawn
    results = spawn(run_collectives, 4)
    for name in COLLECTIVES:
        print(table(results, name))
    print(f"max |reduce_scatter + all_gather - all_reduce| = {max(r['rs_plus_ag_diff'] for r in results):.1e}")


if __name__ == "__main__":
    main()
