"""How often to snapshot: one model of the time wasted, its best interval, and Young's and Daly's formulas.

    python -m source_code.resilience.young_daly --snapshot-seconds 30 --failures-per-day 2

The model: the job computes for ``tau`` seconds, then writes a snapshot for ``C`` seconds, and
again; failures arrive at random (a Poisson process), one every ``M`` seconds on average (the
job's MTBF: a node's MTBF divided by the number of nodes); a failure throws away everything
since the last completed snapshot (the restart itself is left out). A period of ``P = tau + C``
seconds completes with probability exp(-P/M), so the expected wall time per completed period is
M (exp(P/M) - 1), and the fraction of time wasted is
    waste(tau) = 1 - tau / (M (exp((tau + C) / M) - 1))
(``waste_fraction``; ``simulate`` checks it with drawn failures); ``best_interval`` finds its
minimum. This is Daly's complete model (2006, "A higher order estimate of the optimum checkpoint
interval for restart dumps"), whose expected run time also holds a factor exp(R/M) for the
restart time R (a restart that a failure can strike and start over; one that no failure can
strike, such as a requeue's wait for nodes, is a factor 1 + R/M), which moves no interval.
Daly's higher-order estimate of its minimum (his eq. 37, ``daly_higher_order``) is
sqrt(2 C M) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C for C < 2M, and M for C >= 2M. Expanded to
first order in P/M the waste is C/(tau + C) + tau/(2M), minimised at sqrt(2 C M) - C
(``first_order_interval``); dropping C against tau as well gives C/tau + tau/(2M) and Young's
interval (1974): sqrt(2 C M). Daly's own first-order model (his simpler cost function, which
counts R and a rework of half a period) gives sqrt(2 C (M + R)) (``daly_first_order``): Young's
with M + R for M. All are close to the model's minimum when
C << M; as C approaches M, Young's and the first-order interval drift away from it while eq. 37
stays nearer (notebook 17 asserts it after its exercise); the model has its own best interval
for C >= 2M too.
"""
from __future__ import annotations

import math
import random

from source_code.cli import Parser, positive_float
from source_code.errors import LaunchError, run_main


def _check(snapshot_s: float, mtbf_s: float) -> None:
    if not (snapshot_s > 0 and mtbf_s > 0) or math.isinf(snapshot_s) or math.isinf(mtbf_s):
        raise ValueError(f"snapshot cost ({snapshot_s}) and MTBF ({mtbf_s}) must be positive "
                         "finite seconds; measure the cost with a timed save")


def waste_fraction(interval_s: float, snapshot_s: float, mtbf_s: float) -> float:
    """The model's expected fraction of wall time not spent on kept work, computing ``interval_s``
    seconds between snapshots."""
    _check(snapshot_s, mtbf_s)
    if not interval_s > 0:
        raise ValueError(f"interval must be positive seconds, got {interval_s}")
    return _waste(interval_s, snapshot_s, mtbf_s)


def _waste(interval_s: float, snapshot_s: float, mtbf_s: float) -> float:
    periods = (interval_s + snapshot_s) / mtbf_s
    if periods > 700:                                   # exp() overflows: nothing is ever kept
        return 1.0
    return 1.0 - interval_s / (mtbf_s * math.expm1(periods))


def best_interval(snapshot_s: float, mtbf_s: float) -> float:
    """The compute time between snapshots that minimises ``waste_fraction``, found numerically:
    a golden-section search on (0, M), where the waste first falls, then rises."""
    _check(snapshot_s, mtbf_s)
    shrink = (math.sqrt(5) - 1) / 2
    lo, hi = 0.0, mtbf_s
    a, b = hi - shrink * (hi - lo), lo + shrink * (hi - lo)
    waste_a, waste_b = _waste(a, snapshot_s, mtbf_s), _waste(b, snapshot_s, mtbf_s)
    for _ in range(200):
        if waste_a <= waste_b:                      # the least waste lies left of b
            hi, b, waste_b = b, a, waste_a
            a = hi - shrink * (hi - lo)
            waste_a = _waste(a, snapshot_s, mtbf_s)
        else:                                       # ... right of a
            lo, a, waste_a = a, b, waste_b
            b = lo + shrink * (hi - lo)
            waste_b = _waste(b, snapshot_s, mtbf_s)
    return (lo + hi) / 2


def young_interval(snapshot_s: float, mtbf_s: float) -> float:
    """Young (1974): the minimum of C/tau + tau/(2M)."""
    _check(snapshot_s, mtbf_s)
    return math.sqrt(2 * snapshot_s * mtbf_s)


def daly_first_order(snapshot_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Daly's first-order model (2006): sqrt(2 C (M + R)); with R = 0 it is Young's interval."""
    _check(snapshot_s, mtbf_s)
    return math.sqrt(2 * snapshot_s * (mtbf_s + restart_s))


def first_order_interval(snapshot_s: float, mtbf_s: float) -> float:
    """The minimum of the model's waste to first order, C/(tau + C) + tau/(2M): sqrt(2CM) - C
    for C < 2M; for C >= 2M, where that is not positive, M (as Daly's eq. 37 takes)."""
    _check(snapshot_s, mtbf_s)
    if snapshot_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2 * snapshot_s * mtbf_s) - snapshot_s


def daly_higher_order(snapshot_s: float, mtbf_s: float) -> float:
    """Daly's higher-order estimate (2006, eq. 37) of the model's best interval:
    sqrt(2CM) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C for C < 2M, M for C >= 2M."""
    _check(snapshot_s, mtbf_s)
    if snapshot_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = snapshot_s / (2 * mtbf_s)
    return math.sqrt(2 * snapshot_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - snapshot_s


def simulate(interval_s: float, snapshot_s: float, mtbf_s: float, failures: int = 20000, seed: int = 0) -> float:
    """The waste measured by drawing ``failures`` exponential times between failures."""
    rng = random.Random(seed)
    period, kept, wall = interval_s + snapshot_s, 0.0, 0.0
    for _ in range(failures):
        up = rng.expovariate(1.0 / mtbf_s)                    # seconds until the next failure
        kept += math.floor(up / period) * interval_s          # completed periods keep their work
        wall += up
    return 1.0 - kept / wall


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--snapshot-seconds", type=positive_float, default=30.0)
    p.add_argument("--failures-per-day", type=positive_float, default=1.0)
    a = p.parse_args(argv)
    mtbf = 86400 / a.failures_per_day
    if math.isinf(a.snapshot_seconds) or math.isinf(mtbf):
        raise LaunchError("error: --snapshot-seconds and --failures-per-day must be finite")
    best = best_interval(a.snapshot_seconds, mtbf)
    young = young_interval(a.snapshot_seconds, mtbf)
    daly = daly_higher_order(a.snapshot_seconds, mtbf)
    first = first_order_interval(a.snapshot_seconds, mtbf)
    print(f"best_interval_s={best:.1f} waste_at_best={waste_fraction(best, a.snapshot_seconds, mtbf):.4f} "
          f"young_interval_s={young:.1f} waste_at_young={waste_fraction(young, a.snapshot_seconds, mtbf):.4f} "
          f"first_order_interval_s={first:.1f} daly_higher_order_s={daly:.1f}")
    return 0


if __name__ == "__main__":
    run_main(main)
