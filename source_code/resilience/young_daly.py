"""How often to snapshot: Young's and Daly's interval from the snapshot cost and the failure rate.

    python -m source_code.resilience.young_daly --snapshot-seconds 30 --failures-per-day 2

Snapshot every tau seconds at cost C each; failures arrive at random, one every M seconds on
average (M = MTBF of the whole job: a node's MTBF divided by the number of nodes). Time wasted
per second of work, to first order: C/tau (writing snapshots) + tau/(2M) (on average half an
interval of work is redone after a failure). Its minimum:
    Young (1974):  tau = sqrt(2 C M)
    Daly (2006):   tau = sqrt(2 C M) - C        (for C < 2M; with the restart included, and
                                                 tau = M when C >= 2M)
and the expected fraction of time wasted at tau: C/tau + tau/(2M) (first order).
"""
from __future__ import annotations

import math

from source_code.cli import Parser, positive_float
from source_code.errors import LaunchError, run_main


def _check(snapshot_s: float, mtbf_s: float) -> None:
    if not (snapshot_s > 0 and mtbf_s > 0) or math.isinf(snapshot_s) or math.isinf(mtbf_s):
        raise ValueError(f"snapshot cost ({snapshot_s}) and MTBF ({mtbf_s}) must be positive "
                         "finite seconds; measure the cost with a timed save")


def young_interval(snapshot_s: float, mtbf_s: float) -> float:
    _check(snapshot_s, mtbf_s)
    return math.sqrt(2 * snapshot_s * mtbf_s)


def daly_interval(snapshot_s: float, mtbf_s: float) -> float:
    _check(snapshot_s, mtbf_s)
    if snapshot_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2 * snapshot_s * mtbf_s) - snapshot_s


def waste_fraction(interval_s: float, snapshot_s: float, mtbf_s: float) -> float:
    """First-order fraction of wall time not spent on new work: snapshots plus redone work."""
    _check(snapshot_s, mtbf_s)
    if not interval_s > 0:
        raise ValueError(f"interval must be positive seconds, got {interval_s}")
    return snapshot_s / interval_s + interval_s / (2 * mtbf_s)


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--snapshot-seconds", type=positive_float, default=30.0)
    p.add_argument("--failures-per-day", type=positive_float, default=1.0)
    a = p.parse_args(argv)
    mtbf = 86400 / a.failures_per_day
    if a.snapshot_seconds >= mtbf:
        raise LaunchError("error: a snapshot that takes longer than the time between failures "
                          "never completes; lower --failures-per-day or --snapshot-seconds")
    y, d = young_interval(a.snapshot_seconds, mtbf), daly_interval(a.snapshot_seconds, mtbf)
    print(f"young_interval_s={y:.1f} daly_interval_s={d:.1f} "
          f"waste_at_daly={waste_fraction(d, a.snapshot_seconds, mtbf):.4f}")
    return 0


if __name__ == "__main__":
    run_main(main)
