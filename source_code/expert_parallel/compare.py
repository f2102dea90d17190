"""Expert parallelism checked: parity with one process (world sizes 2 and 4), and what the
balancing loss does to the load of the experts.

    python -m source_code.expert_parallel.compare                # starts its own processes
    python -m source_code.expert_parallel.compare --aux-coef 0.05 --steps 100

1. ``harness.report`` on 2 and then 4 processes: the MoE layer (top-1 and top-2, with and
   without capacity dropping, with a shared expert, dropless and with a capacity under a skewed
   router) and the MoE TransformerLM on every (dp, ep) mesh of the world size (and once with
   a shared expert), outputs and gradients against one process on the same global batch;
2. ``train.balance_study`` on 2 processes: the same short training without any balancing,
   with the balancing loss, with aux-loss-free bias balancing (DeepSeek-V3) and with the
   balancing loss plus the router z-loss; the held-out tokens per expert, max / mean for the
   worst layer.

Rank 0 of each run hands its results back (processes.spawn); the last line:

    summary: ep_parity worlds=2,4 cases=C tol=T ep_max_abs_diff=D balance_loss_effect=R
             aux_free_balance_effect=B dropless_dropped=0 skewed_capacity_dropped=P

D: the largest difference of outputs and gradients vs one process over every case (goal
D <= T: 1e-5 in fp32 on the CPU); R: imbalance with the balancing loss / without any
balancing (goal R < 1); B: the same with bias balancing and no auxiliary loss (goal B < 1);
dropless_dropped: the assignments the dropless cases did not dispatch, counted from their
all-to-all's splits (goal 0); P: those the capacity case dropped on the same skewed input
(goal > 0). Exit status 1 when a goal is missed.
"""
from __future__ import annotations

from source_code import processes
from source_code.cli import Parser, positive_float, positive_int
from source_code.distributed import run_main
from source_code.expert_parallel import harness, train

WORLDS = (2, 4)


def dispatched(per_rank: list, i: int) -> list:
    """Layer case ``i``: the rows each rank's dispatch all-to-all sent (its splits' sum)."""
    return [sum(r["layers"][i]["calls"][1]["send"]) for r in per_rank]     # calls: counts, dispatch, ...


def received(per_rank: list, i: int) -> list:
    """Layer case ``i``: the rows each rank's dispatch all-to-all received (its own included):
    the receive buffer its experts read from."""
    return [sum(r["layers"][i]["calls"][1]["recv"]) for r in per_rank]


def not_dispatched(per_rank: list, i: int) -> int:
    """Layer case ``i``: assignments that no all-to-all carried (k x tokens less the rows sent)."""
    return per_rank[0]["layers"][i]["assignments"] - sum(dispatched(per_rank, i))


def dropless_dropped(per_world: dict) -> int:
    """Over every dropless layer case of every world size: assignments not dispatched."""
    return sum(not_dispatched(per_rank, i) for per_rank in per_world.values()
               for i, c in enumerate(per_rank[0]["layers"]) if c["capacity_factor"] is None)


def skewed_capacity_dropped(per_world: dict) -> int:
    """Over the skewed cases with a capacity: assignments not dispatched."""
    return sum(not_dispatched(per_rank, i) for per_rank in per_world.values()
               for i, c in enumerate(per_rank[0]["layers"]) if c["skew"] and c["capacity_factor"] is not None)


def parity_rows(per_world: dict) -> list:
    """One row per (world, case): the largest difference of each kind over the ranks."""
    rows = []
    for world, per_rank in per_world.items():
        for i, case in enumerate(per_rank[0]["layers"]):
            d = {key: max(r["layers"][i]["diffs"][key] for r in per_rank) for key in case["diffs"]}
            rows.append({"world": world, "what": "layer " + harness.case_name(
                             case["k"], case["capacity_factor"], case["n_shared"], case["skew"])
                         + f" ({not_dispatched(per_rank, i)} of {case['assignments']} dropped)",
                         "worst": max(d.values()), **d})
        for i, m in enumerate(per_rank[0]["models"]):
            worst = max(max(r["models"][i][key] for key in ("logits", "loss", "grads")) for r in per_rank)
            rows.append({"world": world, "what": f"model, mesh dp={m['dp']} x ep={m['ep']}"
                         + (f", {m['n_shared']} shared expert" if m["n_shared"] else ""), "worst": worst,
                         "output": max(r["models"][i]["logits"] for r in per_rank),
                         "grads": max(r["models"][i]["grads"] for r in per_rank)})
    return rows


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--aux-coef", type=positive_float, default=0.01, help="weight of the balancing loss")
    p.add_argument("--steps", type=positive_int, default=train.DEFAULTS["steps"])
    p.add_argument("--device", choices=("cpu", "auto"), default="cpu",
                   help="cpu: gloo on the CPU; auto: the device policy (one GPU per process)")
    args = p.parse_args(argv)
    per_world = {n: processes.spawn(harness.report, n, device=args.device, stream=False) for n in WORLDS}
    rows = parity_rows(per_world)
    tol = max(r[0]["tol"] for r in per_world.values())
    for n, per_rank in per_world.items():   # where each run computed, and the tolerance that follows
        print(f"{n} ranks on {per_rank[0]['device']}: {per_rank[0]['why']}")
    for row in rows:
        print(f"parity world={row['world']} {row['what']}: max |diff| {row['worst']:.1e}")
    study = processes.spawn(train.balance_study, 2, args.aux_coef, args.steps,
                            device=args.device, stream=False)[0]
    for name, what in (("without", "without balancing"), ("with", "balancing loss"),
                       ("aux_free", "bias balancing"), ("z_loss", "balancing loss + z-loss")):
        r = study[name]
        for i, tokens in enumerate(r["per_expert"]):
            print(f"{what}, layer {i}: tokens per expert {tokens} (max/mean {train.imbalance(tokens):.2f})")
    d = max(row["worst"] for row in rows)
    ratio = study["with"]["imbalance"] / study["without"]["imbalance"]
    free = study["aux_free"]["imbalance"] / study["without"]["imbalance"]
    dropless, capped = dropless_dropped(per_world), skewed_capacity_dropped(per_world)
    print(f"summary: ep_parity worlds={','.join(map(str, WORLDS))} cases={len(rows)} tol={tol:g} "
          f"ep_max_abs_diff={d:.2e} balance_loss_effect={ratio:.3f} aux_free_balance_effect={free:.3f} "
          f"dropless_dropped={dropless} skewed_capacity_dropped={capped}")
    return 0 if d <= tol and ratio < 1 and free < 1 and dropless == 0 and capped > 0 else 1


if __name__ == "__main__":
    run_main(main)
