"""The collectives of torch.distributed, each run on several processes with inputs and outputs shown.

all_reduce, broadcast, reduce, all_gather_into_tensor and reduce_scatter_tensor on small integer
tensors (rank r starts with [10r, 10r+1, ...]) so that every output can be checked by hand; and
all-reduce computed a second way, as reduce-scatter followed by all-gather.

    python -m source_code.sync.collectives          # 4 processes, prints one table per collective
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

# torch >= 2.13 marks the *_tensor collectives deprecated in favour of functional ones; they are
# still the plain, documented calls that work on torch 2.6 and on gloo, so say it once, not per call
warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).*",
                        category=FutureWarning)

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def _input(rank: int, world: int) -> torch.Tensor:
    return torch.arange(world, dtype=torch.int64) + 10 * rank     # [N]


def run_collectives() -> dict:
    """Run on every rank: {collective: (input list, output list or None where undefined)}."""
    from source_code.distributed import context
    rank, world = dist.get_rank(), dist.get_world_size()
    x = _input(rank, world).to(context().device)                   # [N]: rank r has 10r + [0..N-1]
    out = {}

    t = x.clone()                                                  # in place: input and output
    dist.all_reduce(t, op=dist.ReduceOp.SUM)                       # everyone: the elementwise sum
    out["all_reduce"] = (x.tolist(), t.tolist())

    t = x.clone()
    dist.broadcast(t, src=0)                                       # everyone: rank 0's tensor
    out["broadcast"] = (x.tolist(), t.tolist())

    t = x.clone()
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)                    # the sum, defined on rank 0 only
    out["reduce"] = (x.tolist(), t.tolist() if rank == 0 else None)

    gathered = torch.empty(world * world, dtype=x.dtype, device=x.device)  # [N * N] output buffer
    dist.all_gather_into_tensor(gathered, x)                       # slot r <- rank r's x
    out["all_gather_into_tensor"] = (x.tolist(), gathered.tolist())

    mine = torch.empty(1, dtype=x.dtype, device=x.device)          # [N / N] = [1] output buffer
    dist.reduce_scatter_tensor(mine, x, op=dist.ReduceOp.SUM)      # rank r: sum over ranks of x[r]
    out["reduce_scatter_tensor"] = (x.tolist(), mine.tolist())

    # all-reduce = reduce-scatter (each rank sums one chunk) + all-gather (hand the chunks round)
    y = torch.randn(world * 3, generator=torch.Generator().manual_seed(rank), dtype=torch.float64).to(x.device)
    chunk = torch.empty(3, dtype=y.dtype, device=y.device)        # [3]: this rank's summed chunk
    dist.reduce_scatter_tensor(chunk, y, op=dist.ReduceOp.SUM)
    two_step = torch.empty_like(y)                                 # [3N]
    dist.all_gather_into_tensor(two_step, chunk)
    reference = y.clone()
    dist.all_reduce(reference, op=dist.ReduceOp.SUM)
    out["rs_plus_ag_diff"] = float((two_step - reference).abs().max())
    out["rs_plus_ag_first"] = (two_step[:3].tolist(), reference[:3].tolist())
    return out


def expected(name: str, rank: int, world: int):
    """What the collective must return on ``rank``, computed by hand from the inputs."""
    inputs = [_input(r, world).tolist() for r in range(world)]
    total = [sum(col) for col in zip(*inputs)]
    return {"all_reduce": total, "broadcast": inputs[0], "reduce": total if rank == 0 else None,
            "all_gather_into_tensor": [v for row in inputs for v in row],
            "reduce_scatter_tensor": [total[rank]]}[name]


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
