"""Bytes per rank of parameters, gradients, optimizer state and activations, per strategy.

    python -m source_code.planner.memory                                  # the default TransformerLM
    python -m source_code.planner.memory --params 1.3e9 --world-size 8   # any model size

The arithmetic is notebook 09's (source_code/sharding/memory_model.py: ZeRO's stages, the
activations of TransformerLM, the bytes sent per step), re-exported here for the planner, with
its command line: the predicted per-rank state of every strategy on 1, 2, 4, 8 ranks.
"""
from __future__ import annotations

import argparse

from source_code.sharding.memory_model import (SHARDED, STRATEGIES, Precision, activation_bytes,  # noqa: F401
                                               calculator, communication_bytes, formula, shard_numel,
                                               state_bytes, table)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=0,
                   help="number of parameters (0: the default TransformerLM)")
    p.add_argument("--world-size", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args(argv)
    if any(n < 1 for n in args.world_size):
        p.error("--world-size values must be >= 1")
    n_params = int(args.params)
    if n_params <= 0:
        from source_code.models import TransformerLM, count_parameters
        n_params = count_parameters(TransformerLM())
    print("\n".join(table(n_params, args.world_size)))
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main   # a LaunchError: its one line, exit status 2
    run_main(main)
