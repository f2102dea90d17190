"""A short training run of the MoE TransformerLM with expert parallelism, with or without the
balancing loss.

    torchrun --standalone --nproc-per-node=2 -m source_code.expert_parallel.train
    torchrun --standalone --nproc-per-node=4 -m source_code.expert_parallel.train --ep 2 --aux-coef 0
    torchrun --standalone --nproc-per-node=2 -m source_code.expert_parallel.train --aux-coef 0 --bias-rate 0.01
    torchrun --standalone --nproc-per-node=2 -m source_code.expert_parallel.train --shared-experts 1
    torchrun --standalone --nproc-per-node=2 -m source_code.expert_parallel.train --capacity-factor 1.25
    TRAIN_MODULE=source_code.expert_parallel.train sbatch slurm/ddp_single_node.slurm --experts 16

The TransformerLM of models.py with its MLPs swapped for MoE layers (moe.py) learns the
generated sort task. The ranks form a (dp, ep) mesh (ep_dp.py): experts split over "ep",
every rank its own share of each global batch, expert gradients reduced over "dp" and the
rest over all ranks. The loss is cross-entropy + aux_coef x the sum of the layers'
balancing losses (+ z_coef x their router z-losses); with --bias-rate, each layer's
aux-loss-free bias moves after every step against its load over all ranks; --shared-experts
adds always-on experts to every MoE layer (replicated, reduced over all ranks); without
--capacity-factor the routing is dropless, with it the assignments each step dropped are
counted from the dispatch all-to-all's splits. After training, the tokens of a held-out batch are routed once more and
counted per layer and expert (before capacity dropping): the imbalance is max / mean of those
counts, the worst layer's. Then the same batch goes through again with each capacity factor of
``FACTORS``: the assignments each layer dropped are counted from the rows its dispatch
all-to-all really carried (wire.recording), beside the rule's sum of max(0, count - C). Rank 0
prints progress; last line:

    summary: world_size=2 epochs=1 accuracy=A seconds=S ep=2 steps=K aux_coef=C imbalance=I
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.distributed import LaunchError, context, print0, ranks_from_env, run_main, session
from source_code.expert_parallel import ep_dp, router, wire
from source_code.expert_parallel.moe import aux_loss, moe_layers, moe_transformer, set_routing, z_loss
from source_code import workload
from source_code.measure import CommCounter, clock, state_bytes
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.expert_parallel.train"
DEFAULTS = {"steps": 60, "batch_size": 32, "lr": 3e-3, "dim": 32, "layers": 2, "heads": 4,
            "experts": 8, "k": 2, "capacity_factor": None, "seed": 0, "renormalise": None, "shared": 0}
HELD_OUT = 256                                     # sequences routed after training
FACTORS = (0.5, 1.0, 1.25, 1.5, 2.0, 4.0)          # capacity factors of the held-out sweep


def imbalance(per_expert) -> float:
    """max / mean of the tokens per expert (1: perfectly even)."""
    t = torch.as_tensor(per_expert, dtype=torch.float64)
    return float(t.max() / t.mean())


def dropped_by_capacity(model, x, factors=FACTORS) -> list:
    """For each capacity factor: the held-out tokens ``x`` through ``model`` once more; per
    layer, the assignments dropped as counted from the dispatch all-to-all (k x tokens less the
    rows it carried) and as the rule says (sum of max(0, count - C) over this rank's counts)."""
    layers = moe_layers(model)
    trained_with, out = layers[0].capacity_factor, []
    for f in factors:
        set_routing(model, capacity_factor=f)
        with torch.no_grad(), wire.recording(model) as calls:
            model(x)
        rows = x.numel()
        per_layer = []
        for i, layer in enumerate(layers):
            carried = sum(calls.payload(i)[0]["send"])             # the dispatch: first payload call
            cap = router.capacity(rows, layer.n_experts, layer.k, f)
            rule = int((layer.counts - cap).clamp(min=0).sum())
            per_layer.append({"counted": layer.k * rows - carried, "rule": rule, "assignments": layer.k * rows})
        out.append({"factor": f, "layers": per_layer})
    set_routing(model, capacity_factor=trained_with)
    return out


def counted_step(model, x, y, aux_coef: float, z_coef: float, dp_group) -> tuple:
    """One forward + backward + gradient reduction, with what it moved counted around it: the
    assignments the dispatch all-to-alls did not carry (dropped) out of all, and the gradient
    bytes all-reduced."""
    with wire.recording(model) as calls:
        ce, loss = _local_loss(model, x, y, aux_coef, z_coef)
    layers = moe_layers(model)
    sent = sum(sum(calls.payload(i)[0]["send"]) for i in range(len(layers)))
    assignments = sum(layer.k * x.numel() for layer in layers)
    loss.backward()
    with CommCounter(dist.get_world_size()) as comm:
        ep_dp.reduce_gradients(model, dp_group)
    return ce, assignments - sent, assignments, comm.payload["all_reduce"]


def _local_loss(model, x, y, aux_coef: float, z_coef: float = 0.0):
    ce = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
    loss = ce + aux_coef * aux_loss(model)
    return ce, (loss + z_coef * z_loss(model)) if z_coef else loss


def balance_biases(model, rate: float) -> None:
    """Aux-loss-free balancing: every layer's bias one step against its load over all ranks."""
    for layer in moe_layers(model):
        load = layer.counts.sum(0).to(torch.float64)
        dist.all_reduce(load)
        layer.balance_bias = router.update_bias(layer.balance_bias, load, rate)


def run(aux_coef: float, ep: int | None = None, log_every: int = 0, z_coef: float = 0.0,
        bias_rate: float = 0.0, **overrides) -> dict:
    """Train on every rank of the job; return the loss curve, the accuracy and the held-out
    tokens per expert of every layer, per rank and summed (plain Python values). ``z_coef``:
    weight of the router z-loss; ``bias_rate``: aux-loss-free bias balancing at that rate
    (0: off)."""
    o = {**DEFAULTS, **overrides}
    world, rank, device = dist.get_world_size(), dist.get_rank(), context().device
    ep = ep or world
    dp = world // ep
    cfg = workload.model_config(dim=o["dim"], n_layers=o["layers"], n_heads=o["heads"])
    mesh = ep_dp.make_mesh(device.type, dp, ep)
    model = moe_transformer(cfg, o["experts"], o["k"], o["capacity_factor"], seed=o["seed"],
                            renormalise=o["renormalise"], n_shared=o["shared"])
    model = ep_dp.to_expert_parallel(model.to(device), mesh["ep"].get_group())
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], weight_decay=0.01)
    train_set, held_out = workload.sort_task(n=2048), workload.sort_task(n=2048)
    losses, start, dropped = [], clock(device), torch.zeros(2, dtype=torch.float64)
    for step in range(o["steps"]):
        x, y = workload.rank_slice(workload.global_batch(train_set, step, o["batch_size"], o["seed"]),
                                   rank, world)
        ce, lost, assignments, reduced = counted_step(model, x.to(device), y.to(device), aux_coef, z_coef,
                                                      mesh["dp"].get_group())
        dropped += torch.tensor([lost, assignments], dtype=torch.float64)
        opt.step()
        if bias_rate:
            balance_biases(model, bias_rate)
        opt.zero_grad(set_to_none=True)
        mean = torch.tensor([ce.item()], dtype=torch.float64)
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        if log_every and ((step + 1) % log_every == 0 or step + 1 == o["steps"]):
            print0(f"  aux_coef {aux_coef:g}" + (f", bias rate {bias_rate:g}" if bias_rate else "")
                   + (f", z-loss {z_coef:g}" if z_coef else "") + (f", {o['shared']} shared" if o["shared"] else "")
                   + (f", capacity {o['capacity_factor']:g}" if o["capacity_factor"] else "") + f": step {step + 1:4d}/{o['steps']}  loss {losses[-1]:.4f}  "
                   f"{clock(device) - start:6.1f}s")
    x, y = (t[-HELD_OUT:] for t in held_out.tensors)
    x, y = (t[rank * (HELD_OUT // world):(rank + 1) * (HELD_OUT // world)].to(device) for t in (x, y))
    with torch.no_grad():
        pred = model(x).argmax(-1)
    z = torch.tensor([float(z_loss(model)) / len(moe_layers(model))], dtype=torch.float64)
    dist.all_reduce(z)                                     # mean router z-loss per layer, over ranks
    keep = y != -100
    hits = torch.tensor([(pred[keep] == y[keep]).sum().item(), keep.sum().item()], dtype=torch.float64)
    dist.all_reduce(hits)
    counts = []                                            # per layer: (world, E) assignments
    for layer in moe_layers(model):
        got = [None] * world
        dist.all_gather_object(got, layer.counts.sum(0).tolist())
        counts.append(got)
    per_expert = [torch.tensor(c).sum(0).tolist() for c in counts]
    seconds = clock(device) - start
    capacity = [None] * world
    dist.all_gather_object(capacity, dropped_by_capacity(model, x))
    state = [None] * world
    dist.all_gather_object(state, state_bytes(model, opt))
    dist.all_reduce(dropped)                               # over ranks: dropped, all assignments
    return {"aux_coef": aux_coef, "z_coef": z_coef, "bias_rate": bias_rate, "z_held_out": z.item() / world,
            "shared": o["shared"], "capacity_factor": o["capacity_factor"],
            "train_dropped": dropped[0].item() / dropped[1].item(), "allreduced_bytes": reduced,
            "state": state, "losses": losses, "accuracy": hits[0].item() / hits[1].item(),
            "per_rank_counts": counts, "per_expert": per_expert, "tokens_per_rank": x.numel(),
            "imbalance": max(imbalance(c) for c in per_expert), "seconds": seconds,
            "capacity": capacity,                                  # per rank: dropped_by_capacity
            "dp": dp, "ep": ep, "k": o["k"], "experts": o["experts"]}


BIAS_RATE = 0.01      # aux-free bias step (DeepSeek-V3: 0.001 over far longer runs)
Z_COEF = 0.01         # router z-loss weight (ST-MoE: 0.001 over far longer runs)


CAPACITY = 1.25      # the capacity-dropping run of the study (the others are dropless)


def balance_study(aux_coef: float = 0.01, steps: int = DEFAULTS["steps"], log_every: int = 20,
                  bias_rate: float = BIAS_RATE, z_coef: float = Z_COEF, more: bool = False, **overrides) -> dict:
    """The same training without any balancing, with the balancing loss, with aux-loss-free
    bias balancing, and with the balancing loss plus the router z-loss (on every rank), all
    dropless; ``more``: also with the balancing loss plus one shared expert per layer, and with
    the balancing loss and capacity dropping at ``CAPACITY``."""
    runs = {"without": run(0.0, log_every=log_every, steps=steps, **overrides),
            "with": run(aux_coef, log_every=log_every, steps=steps, **overrides),
            "aux_free": run(0.0, log_every=log_every, steps=steps, bias_rate=bias_rate, **overrides),
            "z_loss": run(aux_coef, log_every=log_every, steps=steps, z_coef=z_coef, **overrides)}
    if more:
        runs["shared"] = run(aux_coef, log_every=log_every, steps=steps, **{**overrides, "shared": 1})
        runs["capacity"] = run(aux_coef, log_every=log_every, steps=steps,
                               **{**overrides, "capacity_factor": CAPACITY})
    return runs


def balance_study_all(aux_coef: float = 0.01) -> dict:
    """``balance_study`` with the shared-expert and the capacity-dropping runs (notebook 14)."""
    return balance_study(aux_coef, more=True)


def parse_args(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--ep", type=positive_int, default=0, help="expert-parallel size (default: all ranks)")
    p.add_argument("--aux-coef", type=float, default=0.01, help="weight of the balancing loss (0: off)")
    p.add_argument("--z-coef", type=float, default=0.0, help="weight of the router z-loss (0: off)")
    p.add_argument("--bias-rate", type=float, default=0.0,
                   help="aux-loss-free bias balancing at this rate per step (0: off; DeepSeek-V3: 0.001)")
    p.add_argument("--gates", choices=("auto", "renormalised", "probability"), default="auto",
                   help="auto: renormalised over the k choices for k >= 2, the probability for k = 1")
    p.add_argument("--steps", type=positive_int, default=DEFAULTS["steps"])
    p.add_argument("--batch-size", type=positive_int, default=DEFAULTS["batch_size"], help="GLOBAL batch")
    p.add_argument("--lr", type=positive_float, default=DEFAULTS["lr"])
    p.add_argument("--experts", type=positive_int, default=DEFAULTS["experts"])
    p.add_argument("--k", type=positive_int, default=DEFAULTS["k"])
    p.add_argument("--capacity-factor", type=positive_float, default=None,
                   help="tokens an expert accepts per rank, times the mean load (default: dropless)")
    p.add_argument("--shared-experts", type=nonnegative_int, default=0,
                   help="always-on experts per MoE layer, replicated on every rank")
    p.add_argument("--dim", type=positive_int, default=DEFAULTS["dim"], help="a multiple of --heads")
    p.add_argument("--heads", type=positive_int, default=DEFAULTS["heads"])
    p.add_argument("--layers", type=positive_int, default=DEFAULTS["layers"])
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def check(args, env=None) -> int:
    """Every flag against the launch, before the process group: the ep size or a LaunchError."""
    found = ranks_from_env(env)
    world = found[2] if found else 1
    ep = args.ep or world
    for flag in ("aux_coef", "z_coef", "bias_rate"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value >= 0):
            raise LaunchError(f"error: --{flag.replace('_', '-')} must be a number >= 0, got {value}")
    if args.dim % args.heads:
        raise LaunchError(f"error: --dim {args.dim} is not divisible by --heads {args.heads}; "
                          f"use a multiple of {args.heads}")
    if not 0 <= args.seed < 2**63:
        raise LaunchError(f"error: --seed must be >= 0, got {args.seed}")
    if world % ep:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        raise LaunchError(f"error: world size {world} is not divisible by --ep {ep}; use one of {divisors}")
    if args.experts % ep:
        raise LaunchError(f"error: --experts {args.experts} do not split over --ep {ep} ranks; "
                          f"use a multiple of {ep}")
    if args.k > args.experts:
        raise LaunchError(f"error: --k {args.k} exceeds --experts {args.experts}")
    if args.batch_size % world:
        raise LaunchError(f"error: --batch-size {args.batch_size} does not divide among {world} "
                          f"ranks; use a multiple of {world}")
    if world > HELD_OUT:
        raise LaunchError(f"error: {world} processes leave no held-out sequence per rank; use at most {HELD_OUT}")
    return ep


def main(argv=None):
    args = parse_args(argv)
    ep = check(args)
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, allow_single=True, seed=args.seed) as ctx:
        print0(f"training the MoE TransformerLM ({args.experts} experts, top-{args.k}) on the sort "
               f"task: {ctx.world_size} processes, ep={ep}, aux_coef={args.aux_coef:g}, "
               f"{ctx.backend} on {ctx.device.type}")
        r = run(args.aux_coef, ep, log_every=10, z_coef=args.z_coef, bias_rate=args.bias_rate, steps=args.steps, batch_size=args.batch_size,
                lr=args.lr, experts=args.experts, k=args.k, capacity_factor=args.capacity_factor,
                dim=args.dim, heads=args.heads, layers=args.layers, seed=args.seed, shared=args.shared_experts,
                renormalise={"auto": None, "renormalised": True, "probability": False}[args.gates])
        for i, tokens in enumerate(r["per_expert"]):
            print0(f"layer {i}: held-out tokens per expert {tokens} (max/mean {imbalance(tokens):.2f})")
        print0(f"dropped in training (counted from the dispatch): {100 * r['train_dropped']:.1f} % of the "
               f"assignments; gradient bytes all-reduced per step on rank 0: {r['allreduced_bytes']:,d}")
        print0(loop.summary_line(ctx.world_size, 1, r["accuracy"], r["seconds"])
               + f" ep={ep} steps={args.steps} aux_coef={args.aux_coef:g} imbalance={r['imbalance']:.3f}")
    return 0


if __name__ == "__main__":
    run_main(main)
