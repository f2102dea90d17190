"""The parallelism planner: which (pp, dp, tp, ZeRO) mesh fits a model on a cluster, and at what
communication cost.

    python -m source_code.planner.plan --model 7b --cluster lumi --nodes 4
    python -m source_code.planner.plan --params 7e9 --layers 32 --hidden 4096 --seq 4096 \\
        --gpus 64 --gpu-mem-gb 64 --gpus-per-node 8 --micro-batch 1 --global-batch 512
    python -m source_code.planner.plan --model 70b --cluster a100 --nodes 16 --tp 4 --pp 4 --zero 1
    python -m source_code.planner.plan --questions     # 7B and 70B on LUMI and on A100 nodes

Prints the plans that fit, shortest estimated step first (bytes per GPU and step by
collective, intra-/inter-node, their time at --intra-gbps / --inter-gbps, plus compute at
--tflops stretched by the pipeline bubble and recomputation), then the ones that do not with
one reason each. With --tp/--pp/--zero (and --dp) it judges that one mesh.
Memory: mesh_memory.py; communication: communication.py; the search: search.py.
"""
from __future__ import annotations


from source_code.cli import Parser, positive_float, positive_int
from source_code.errors import LaunchError, run_main
from source_code.planner.search import (ZERO_VARIANTS, Plan, activations_both_ways, describe_comm,
                                       describe_memory, evaluate, search)
from source_code.planner.spec import GB, PRECISIONS, PRESETS, Cluster, Config, Model, model_from

CLUSTERS = {  # per GPU: memory, bandwidth inside a node and the network share between nodes
    # LUMI-G: 8 MI250X GCDs, 4 x 25 GB/s Slingshot per node; ~40 % of 191 bf16 TFLOP/s per GCD
    "lumi": dict(gpus_per_node=8, gpu_mem_gb=64, intra_gbps=50, inter_gbps=12.5, tflops=75),
    # 4 x A100-40GB with NVLink, one 200 Gb/s HDR link per node; ~40 % of 312 TFLOP/s
    "a100": dict(gpus_per_node=4, gpu_mem_gb=40, intra_gbps=200, inter_gbps=6.25, tflops=125),
}
QUESTIONS = [("7b", "lumi", 4), ("7b", "a100", 4), ("70b", "lumi", 16), ("70b", "a100", 16)]
GLOBAL_BATCH = 512  # sequences per step (2M tokens at seq 4096)


def cluster_of(name: str, nodes: int, **override) -> Cluster:
    spec = {**CLUSTERS[name], **{k: v for k, v in override.items() if v}}
    return Cluster(gpus=nodes * spec["gpus_per_node"], **spec)


def baseline(model: Model, cluster: Cluster, zero: int, gb: int, mb: int, prec: str,
             checkpointing: bool = False) -> Plan:
    return evaluate(model, Config(dp=cluster.gpus, zero=zero, micro_batch=mb, global_batch=gb,
                                  checkpointing=checkpointing), cluster, prec)


def assumptions(cluster: Cluster, precision: str = "bf16") -> list[str]:
    """The numbers the ranking rests on, as lines (every one a flag of this command)."""
    p = PRECISIONS[precision]
    return [f"  assumes: {cluster.tflops:g} TFLOP/s sustained per GPU (--tflops) on 6 x parameters "
            f"+ 12 x layers x seq x hidden FLOPs per token, x 4/3 with checkpointing, / (1 - pipeline "
            f"bubble); {cluster.intra_gbps:g} GB/s per GPU inside a node, {cluster.inter_gbps:g} GB/s "
            f"between nodes (--intra-gbps, --inter-gbps), no overlap with compute, no latency; "
            f"{cluster.usable:.0%} of {cluster.gpu_mem_gb:g} GB usable; {p.param}+{p.grad}+"
            f"{p.optimizer} bytes per parameter ({precision}: {p.accounting}; --precision "
            f"{' or '.join(k for k in PRECISIONS if k != precision)} for the others)",
            "  ZeRO as assumed in memory and traffic alike: " + "; ".join(ZERO_VARIANTS[z] for z in (1, 2, 3))]


def explain(model: Model, cluster: Cluster, micro_batch: int = 1, global_batch: int = GLOBAL_BATCH,
            precision: str = "bf16") -> dict:
    """The planner's answer and its reasons, every number from the planner: {"best", "lines"}."""
    fit, fail = search(model, cluster, micro_batch, global_batch, precision)
    nodes = cluster.gpus // cluster.gpus_per_node
    lines = [f"{model.name}: {model.params() / 1e9:.1f}e9 parameters, {precision}, seq {model.seq}, "
             f"global batch {global_batch} on {nodes} nodes x {cluster.gpus_per_node} GPUs x "
             f"{cluster.gpu_mem_gb:g} GB ({cluster.gpus} GPUs)"]
    per_param = PRECISIONS[precision]
    states = model.params() * (per_param.param + per_param.grad + per_param.optimizer) / GB
    lines += assumptions(cluster, precision)
    lines.append(f"  weights + gradients + Adam state: {states:.0f} GB in all, "
                 f"{states / cluster.gpus:.1f} GB per GPU if perfectly sharded")
    for zero, name in ((0, "DDP"), (3, "FSDP (ZeRO-3)")):
        b = baseline(model, cluster, zero, global_batch, micro_batch, precision)
        line = f"  pure {name} over {cluster.gpus} GPUs: " + (
            f"fits, {describe_memory(b)}; {describe_comm(b)}" if b.fits else b.reason)
        if not b.fits:
            c = baseline(model, cluster, zero, global_batch, micro_batch, precision, True)
            line += ("; with checkpointing " + (f"fits, {describe_memory(c)}; {describe_comm(c)}"
                                                 if c.fits else c.reason.split(" > ")[0]))
        lines.append(line)
    if not fit:
        lines.append("  nothing fits: more GPUs, a smaller micro-batch or a shorter sequence")
        return {"best": None, "lines": lines, "fit": fit, "fail": fail}
    best = fit[0]
    lines.append(f"  best: {best.cfg.label()}: {describe_memory(best)}")
    lines.append(f"        ({activations_both_ways(model, best.cfg, precision)} on stage 0)")
    lines.append(f"        {describe_comm(best)}"
                 + (f"; pipeline bubble {best.bubble:.0%}" if best.cfg.pp > 1 else ""))
    lines += [f"        note: {n}" for n in best.notes]
    if best.notes:
        plain = next((p for p in fit if not p.notes), None)
        if plain is not None:
            lines.append(f"  best plan without that note: {plain.cfg.label()}: {describe_memory(plain)}; "
                         f"step ~{plain.step_s:.1f} s")
    dp_only = [p for p in fit if p.cfg.tp == 1 and p.cfg.pp == 1]
    if dp_only and dp_only[0] is not best:
        d = dp_only[0]
        lines.append(f"  vs the best data-parallel-only plan {d.cfg.label()}: step ~{d.step_s:.1f} s "
                     f"(communication ~{d.comm_s:.2f} s) against ~{best.step_s:.1f} s "
                     f"(~{best.comm_s:.2f} s)")
    elif not dp_only:
        lines.append("  no data-parallel-only plan fits: the model has to be cut with tp and/or pp")
    why = {}
    for p in fail:
        why.setdefault(p.reason.split(" (")[0].split(";")[0][:60], p)
    lines.append(f"  {len(fit)} plans fit, {len(fail)} do not")
    return {"best": best, "lines": lines, "fit": fit, "fail": fail}


def table(fit: list[Plan], fail: list[Plan], top: int, show_all: bool) -> list[str]:
    out = [f"{'plan':42s} {'GB/GPU':>7s} {'AR GB':>7s} {'AG GB':>7s} {'RS GB':>7s} {'P2P GB':>7s}"
           f" {'intra':>7s} {'inter':>7s} {'comm s':>7s} {'bubble':>6s} {'step s':>7s}"]
    for p in fit[:None if show_all else top]:
        t = p.totals()
        out.append(f"{p.cfg.label():42s} {p.memory['total'] / GB:7.1f} {t['all_reduce'] / GB:7.2f} "
                   f"{t['all_gather'] / GB:7.2f} {t['reduce_scatter'] / GB:7.2f} {t['send_recv'] / GB:7.2f} "
                   f"{t['intra'] / GB:7.2f} {t['inter'] / GB:7.2f} {p.comm_s:7.2f} {p.bubble:6.0%} {p.step_s:7.1f}"
                   + (" *" if p.notes else ""))
    shown = fit[:None if show_all else top]
    if any(p.notes for p in shown):
        out.append("* " + next(p for p in shown if p.notes).notes[0].split(":")[0]
                   + ": every micro-batch would reduce-scatter (ZeRO-3: and all-gather)")
    if len(fit) > top and not show_all:
        out.append(f"... and {len(fit) - top} more that fit (--all lists them)")
    out.append(f"do not fit or cannot be built ({len(fail)}):")
    for p in fail[:None if show_all else top]:
        out.append(f"  {p.cfg.label():42s} {p.reason}")
    if len(fail) > top and not show_all:
        out.append(f"  ... and {len(fail) - top} more (--all lists them)")
    return out


def parse_args(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="", help=f"a named size: {', '.join(PRESETS)}")
    p.add_argument("--params", type=positive_float, default=0.0)
    p.add_argument("--layers", type=positive_int, default=0)
    p.add_argument("--hidden", type=positive_int, default=0)
    p.add_argument("--heads", type=positive_int, default=0)
    p.add_argument("--seq", type=positive_int, default=0)
    p.add_argument("--cluster", default="", choices=["", *CLUSTERS])
    p.add_argument("--nodes", type=positive_int, default=0)
    p.add_argument("--gpus", type=positive_int, default=0)
    p.add_argument("--gpus-per-node", type=positive_int, default=0)
    p.add_argument("--gpu-mem-gb", type=positive_float, default=0.0)
    p.add_argument("--intra-gbps", type=positive_float, default=0.0)
    p.add_argument("--inter-gbps", type=positive_float, default=0.0)
    p.add_argument("--tflops", type=positive_float, default=0.0, help="sustained TFLOP/s per GPU")
    p.add_argument("--micro-batch", type=positive_int, default=1)
    p.add_argument("--global-batch", type=positive_int, default=GLOBAL_BATCH)
    p.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    p.add_argument("--tp", type=positive_int, default=0, help="judge one mesh: its tp (with --pp, --zero)")
    p.add_argument("--pp", type=positive_int, default=1)
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--top", type=positive_int, default=10)
    p.add_argument("--all", action="store_true")
    p.add_argument("--questions", action="store_true", help="7B and 70B on LUMI and on A100 nodes")
    return p.parse_args(argv)


def build(args) -> tuple[Model, Cluster]:
    try:
        model = model_from(args.model, args.params, args.layers, args.hidden, args.heads, args.seq)
    except ValueError as err:
        raise LaunchError(f"error: {err}") from None
    if args.cluster:
        nodes = args.nodes or max(1, args.gpus // CLUSTERS[args.cluster]["gpus_per_node"]) or 1
        cluster = cluster_of(args.cluster, nodes, gpu_mem_gb=args.gpu_mem_gb,
                             intra_gbps=args.intra_gbps, inter_gbps=args.inter_gbps, tflops=args.tflops)
    else:
        if not (args.gpus_per_node and args.gpu_mem_gb and (args.gpus or args.nodes)):
            raise LaunchError("error: give --cluster NAME --nodes N, or --gpus (or --nodes), "
                              "--gpus-per-node and --gpu-mem-gb")
        gpus = args.gpus or args.nodes * args.gpus_per_node
        cluster = Cluster(gpus=gpus, gpus_per_node=args.gpus_per_node, gpu_mem_gb=args.gpu_mem_gb,
                          **{k: v for k, v in dict(intra_gbps=args.intra_gbps, tflops=args.tflops,
                                                   inter_gbps=args.inter_gbps).items() if v})
    if cluster.gpus > cluster.gpus_per_node and cluster.gpus % cluster.gpus_per_node:
        raise LaunchError(f"error: --gpus {cluster.gpus} is not a whole number of "
                          f"{cluster.gpus_per_node}-GPU nodes")
    return model, cluster


def main(argv=None):
    args = parse_args(argv)
    if args.questions:
        for name, site, nodes in QUESTIONS:
            print("\n".join(explain(PRESETS[name], cluster_of(site, nodes))["lines"]))
        return 0
    model, cluster = build(args)
    if args.tp:
        if cluster.gpus % (args.tp * args.pp):
            raise LaunchError(f"error: tp x pp = {args.tp * args.pp} does not divide {cluster.gpus} GPUs")
        cfg = Config(dp=cluster.gpus // (args.tp * args.pp), tp=args.tp, pp=args.pp, zero=args.zero,
                     micro_batch=args.micro_batch, global_batch=args.global_batch,
                     checkpointing=args.checkpointing)
        plan = evaluate(model, cfg, cluster, args.precision)
        print(f"{cfg.label()}: " + ("fits, " + describe_memory(plan) if plan.fits else plan.reason))
        print(f"  assumes {ZERO_VARIANTS[cfg.zero]}; {cfg.micro_batches} micro-batch(es) per step "
              "and pipeline")
        for note in plan.notes:
            print(f"  note: {note}")
        if plan.memory:
            print(f"  {activations_both_ways(model, cfg, args.precision)} on stage 0")
        if plan.comm:
            print("  " + describe_comm(plan))
        return 0 if plan.fits else 1
    info = explain(model, cluster, args.micro_batch, args.global_batch, args.precision)
    print("\n".join(info["lines"]))
    print("\n".join(table(info["fit"], info["fail"], args.top, args.all)))
    return 0


if __name__ == "__main__":
    run_main(main)
