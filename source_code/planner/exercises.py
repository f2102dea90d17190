"""Check function for notebook 12's exercise (reference solution: source_code/solutions/nb12_mesh.py).

    from source_code.planner.exercises import SCENARIO, check_mesh
    check_mesh({"dp": ..., "tp": ..., "pp": ..., "zero": ..., "checkpointing": ...})

The scenario: the 7b model (spec.PRESETS) on 2 nodes of 4 x A100-40GB, bf16, global batch
512 of sequences of 4096 tokens, micro-batch 1. A good mesh uses all 8 GPUs, can be built,
fits in memory, and its estimated step is within ``SLACK`` of the planner's best plan. A wrong
answer raises AssertionError with what is wrong and a hint; an unfinished one
(NotImplementedError) says so.
"""
from __future__ import annotations

from source_code.planner.plan import GLOBAL_BATCH, cluster_of
from source_code.planner.search import describe_comm, describe_memory, evaluate, search
from source_code.planner.spec import PRESETS, Config

SCENARIO = {"model": "7b", "cluster": "a100", "nodes": 2, "micro_batch": 1,
            "global_batch": GLOBAL_BATCH, "precision": "bf16"}
SLACK = 0.05
KNOBS = {"zero": "ZeRO stage (1 shards the optimizer state, 2 also the gradients, 3 also "
                 "the parameters)",
         "tp": "tensor parallelism (cuts the blocks' matrices and activations)",
         "pp": "pipeline parallelism (cuts the layers)"}


def scenario():
    return PRESETS[SCENARIO["model"]], cluster_of(SCENARIO["cluster"], SCENARIO["nodes"])


def check_mesh(choice) -> str:
    """``choice``: {"dp", "tp", "pp", "zero", "checkpointing"} (missing keys: 1, 1, 1, 0, False)."""
    if choice is None or choice is NotImplemented:
        raise NotImplementedError("exercise not done yet: fill in your mesh, then run this cell again")
    model, cluster = scenario()
    c = {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "checkpointing": False, **dict(choice)}
    cfg = Config(dp=c["dp"], tp=c["tp"], pp=c["pp"], zero=c["zero"],
                 micro_batch=SCENARIO["micro_batch"], global_batch=SCENARIO["global_batch"],
                 checkpointing=bool(c["checkpointing"]))
    assert cfg.gpus == cluster.gpus, (
        f"dp x tp x pp = {cfg.gpus}, but the job has {cluster.gpus} GPUs. Hint: every GPU belongs "
        "to exactly one (dp, tp, pp) coordinate; the three sizes multiply to the GPU count")
    assert cfg.zero in (0, 1, 2, 3), "zero is the ZeRO stage: 0 (DDP), 1, 2 or 3 (FSDP)"
    plan = evaluate(model, cfg, cluster, SCENARIO["precision"])
    assert plan.memory, (f"{cfg.label()} cannot be built: {plan.reason}. Hint: tp must divide the "
                         f"heads and the {cluster.gpus_per_node} GPUs of a node")
    assert plan.fits, (
        f"{cfg.label()} does not fit: {plan.reason}. Hint: which term is largest? Shard it with "
        f"a higher {KNOBS['zero']}, or cut the model with tp/pp; activations shrink with "
        "checkpointing or tp, not with more pipeline stages (under 1F1B stage 0 holds pp "
        "micro-batches of its layers)")
    fit, _ = search(model, cluster, SCENARIO["micro_batch"], SCENARIO["global_batch"],
                    SCENARIO["precision"])
    best = fit[0]
    assert plan.step_s <= (1 + SLACK) * best.step_s, (
        f"{cfg.label()} fits ({describe_memory(plan)}) but its step takes ~{plan.step_s:.0f} s "
        f"against ~{best.step_s:.0f} s for the best plan: {describe_comm(plan)}. Hint: look at the "
        "bytes that cross nodes and at what ZeRO-2 and ZeRO-3 repeat for every micro-batch; "
        "recomputation (checkpointing) costs a third more compute")
    return (f"correct: {cfg.label()} fits ({plan.memory['total'] / 1e9:.1f} GB per GPU) and its "
            f"step (~{plan.step_s:.1f} s) is within {SLACK:.0%} of the best plan's "
            f"({best.cfg.label()}, ~{best.step_s:.1f} s)"
            + "".join(f"; note: {n}" for n in plan.notes))
