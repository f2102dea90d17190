"""Check function for the exercise of notebook 08 (solution: source_code/solutions/nb08_sharding.py).

    from source_code.sharding.exercises import check_predict_state_bytes
    check_predict_state_bytes(predict_state_bytes, rows)   # rows: memory_report.measure(...)

The learner writes ``predict_state_bytes(n_params, world_size, strategy)`` returning the bytes
one rank keeps for {"params", "grads", "optimizer"} (fp32, AdamW). It is compared with the
planner (source_code/planner/memory.py) on many cases, and with the bytes counted in a real
run (``rows``), within 10 %.
"""
from __future__ import annotations

from source_code.planner import memory as planner

CASES = [(p, n, s) for p in (1_000, 107_776, 7_000_000) for n in (1, 2, 4, 8)
         for s in planner.STRATEGIES]
HINTS = {"params": "only FSDP (ZeRO-3) shards the parameters",
         "grads": "ZeRO-2 and FSDP keep 1/N of the gradients, DDP and ZeRO-1 all of them",
         "optimizer": "AdamW keeps 2 numbers per parameter (exp_avg, exp_avg_sq), 4 bytes "
                      "each; every ZeRO stage shards them"}


def check_predict_state_bytes(predict, rows=None, tol: float = 0.10) -> str:
    try:
        predict(1000, 2, "ddp")
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fill in predict_state_bytes, "
                                  "then run this cell again") from None
    for p, n, s in CASES:
        want = planner.state_bytes(p, n, s, step_bytes=0)
        got = predict(p, n, s)
        for key in ("params", "grads", "optimizer"):
            g = float(got[key])
            assert abs(g - want[key]) <= tol * want[key], (
                f"predict_state_bytes({p}, {n}, {s!r})[{key!r}] = {g:,.0f} bytes, expected about "
                f"{want[key]:,.0f}. Hint: {HINTS[key]}")
    checked = 0
    for r in rows or []:
        strategy = "fsdp" if r["strategy"].startswith("fsdp") else r["strategy"]
        got = predict(r["n_params"], r["world_size"], strategy)
        for key in ("params", "grads", "optimizer"):
            assert abs(float(got[key]) - r[key]) <= tol * r[key], (
                f"for the measured run ({r['strategy']}, N={r['world_size']}) you predict "
                f"{float(got[key]):,.0f} {key} bytes, the rank counted {r[key]:,d}. Hint: {HINTS[key]}")
            checked += 1
    msg = (f"correct: {len(CASES)} planner cases" +
           (f" and {checked} counted byte figures within {tol:.0%}" if checked else ""))
    print(msg)
    return msg
