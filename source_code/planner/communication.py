"""Bytes on the wire per training step and GPU, by collective and by where they travel.

Per step, for the busiest GPU of a (pp, dp, tp) configuration (spec.Config), with
bandwidth-optimal collectives over a group of n ranks: an all-reduce of S bytes sends
2(n-1)/n S per rank, an all-gather or reduce-scatter of S (the full tensor) (n-1)/n S, a
send S. ``payload`` is S summed over the calls, ``wire`` what each rank sends.

    tp  all_reduce      activations (micro_batch x seq x hidden): 2 per block forward (after
                        the attention output and the MLP down projection, RowwiseParallel),
                        2 backward (4 with separate q, k, v: each ColwiseParallel input
                        reduces its gradient); a checkpointed block repeats its forward ones
    dp  all_reduce      DDP (ZeRO 0): the gradients, once per step
        reduce_scatter  the gradients. ZeRO-1: once per step (the full gradients are
                        accumulated over the m micro-batches first); ZeRO-2 and ZeRO-3: once
                        per micro-batch (a rank keeps only 1/dp of the gradients, so it must
                        hand the rest off after every backward: DeepSpeed's ZeRO-2)
        all_gather      ZeRO 1/2: the updated parameters, once per step; ZeRO 3 (FSDP2):
                        before each forward, and again before each block's backward (the root
                        module's parameters stay gathered between forward and backward)
    pp  send/recv       activations forward and their gradients backward, per micro-batch

Where: ranks are laid out tp fastest, then dp, then pp (rank = (pp_i dp + dp_i) tp + tp_i),
nodes hold consecutive ranks; a group whose ranks are all on one node talks "intra" (NVLink,
Infinity Fabric), otherwise "inter" (the network), and the slower link sets its speed.
"""
from __future__ import annotations

from source_code.planner.mesh_memory import stage_layers, stage_params
from source_code.planner.spec import Cluster, Config, Model, Precision, PRECISIONS

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


def rank_of(cfg: Config, p: int, d: int, t: int) -> int:
    return (p * cfg.dp + d) * cfg.tp + t


def where(cfg: Config, dim: str, gpus_per_node: int) -> str:
    """"intra" if every group along ``dim`` (tp, dp, or pp neighbours) sits on one node."""
    ranges = {"pp": range(cfg.pp), "dp": range(cfg.dp), "tp": range(cfg.tp)}
    others = [k for k in ("pp", "dp", "tp") if k != dim]
    for a in ranges[others[0]]:
        for b in ranges[others[1]]:
            fixed = dict(zip(others, (a, b)))
            nodes = {rank_of(cfg, **{k[0]: v for k, v in {**fixed, dim: i}.items()}) // gpus_per_node
                     for i in ranges[dim]}
            if len(nodes) > 1:
                return "inter"
    return "intra"


def _row(dim, kind, payload, factor, calls, cfg, gpus_per_node):
    return {"dim": dim, "kind": kind, "payload": payload, "wire": factor * payload,
            "calls": calls, "where": where(cfg, dim, gpus_per_node)}


def per_step(model: Model, cfg: Config, gpus_per_node: int = 8,
             prec: Precision | str = "fp32") -> list[dict]:
    """Rows {"dim", "kind", "payload", "wire", "calls", "where"} for the busiest GPU."""
    prec = PRECISIONS[prec] if isinstance(prec, str) else prec
    m, rows = cfg.micro_batches, []
    act = cfg.micro_batch * model.seq * model.hidden * prec.activation  # one activation tensor
    layers = max(stage_layers(model.layers, cfg.pp))
    if cfg.tp > 1:
        per_block = 2 * (2 if cfg.checkpointing else 1) + (2 if model.fused_qkv else 4)
        calls = m * layers * per_block
        rows.append(_row("tp", "all_reduce", calls * act, 2 * (cfg.tp - 1) / cfg.tp, calls,
                         cfg, gpus_per_node))
    if cfg.dp > 1:
        f = (cfg.dp - 1) / cfg.dp
        p = max(stage_params(model, cfg, s) for s in range(cfg.pp))
        if cfg.zero == 0:
            rows.append(_row("dp", "all_reduce", p * prec.grad, 2 * f, 1, cfg, gpus_per_node))
        elif cfg.zero in (1, 2):
            rs = 1 if cfg.zero == 1 else m      # memory matches: full grads (1), 1/dp (2)
            rows.append(_row("dp", "reduce_scatter", rs * p * prec.grad, f, rs, cfg, gpus_per_node))
            rows.append(_row("dp", "all_gather", p * prec.param, f, 1, cfg, gpus_per_node))
        else:
            blocks = layers * (-(-model.block_tp_sharded() // cfg.tp) + model.block_replicated())
            rows.append(_row("dp", "reduce_scatter", m * p * prec.grad, f, m, cfg, gpus_per_node))
            rows.append(_row("dp", "all_gather", m * (p + blocks) * prec.gather_bytes, f, 2 * m,
                             cfg, gpus_per_node))
    if cfg.pp > 1:
        sends = 2 if cfg.pp > 2 else 1      # a middle stage sends forward and backward
        rows.append(_row("pp", "send_recv", m * sends * act, 1.0, m * sends, cfg, gpus_per_node))
    return rows


def totals(rows: list[dict]) -> dict:
    """Wire bytes by kind and by where, and their sum."""
    out = {k: 0.0 for k in KINDS} | {"intra": 0.0, "inter": 0.0, "total": 0.0}
    for r in rows:
        out[r["kind"]] += r["wire"]
        out[r["where"]] += r["wire"]
        out["total"] += r["wire"]
    return out


def seconds(rows: list[dict], cluster: Cluster) -> float:
    """Time to move the bytes at the cluster's per-GPU bandwidths (no overlap, no latency)."""
    bw = {"intra": cluster.intra_gbps * 1e9, "inter": cluster.inter_gbps * 1e9}
    return sum(r["wire"] / bw[r["where"]] for r in rows)
