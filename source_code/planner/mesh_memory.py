"""Bytes per GPU of a (pp, dp, tp) configuration: parameters, gradients, optimizer state,
activations (with and without activation checkpointing) and transient buffers.

Where each term comes from (the single-strategy version is memory.py):

* pipeline: stage s holds its share of the blocks (earlier stages take the extra one, as
  pipeline.stages.split_layers), the first stage also the embeddings, the last the final norm
  and the head; the busiest stage decides whether a configuration fits;
* tensor parallelism divides the blocks' big matrices by tp (spec.Model.block_tp_sharded);
  LayerNorms, the down bias, embeddings and head stay whole on every tp rank (the workshop's
  plan, source_code/mesh/tp.py);
* the ZeRO stage of the dp dimension divides optimizer state (>= 1), gradients (>= 2) and
  parameters (3 = FSDP) by dp (memory.calculator.state_bytes, shared with notebook 08). With gradient accumulation over m
  micro-batches ZeRO-1 holds the full gradients until the step's one reduce-scatter, ZeRO-2
  and 3 keep 1/dp because they reduce-scatter after every micro-batch (communication.py
  charges that traffic: memory and bytes on the wire describe the same variant);
* activations per token and block, counted for the TransformerLM in memory.formula (one
  function with notebook 08, each term in its dtype on a GPU: LayerNorm statistics and the
  attention's log-sum-exp in fp32): 4h + 4 values stay whole under TP (block input, the LayerNorms' inputs, outputs and
  statistics), 12h + heads values are cut by tp (q, k, v, attention output, log-sum-exp, the
  MLP's up projection and GELU). With checkpointing a block keeps only its input (h values)
  and one block's activations exist again while it is recomputed;
* 1F1B keeps min(pp - s, m) micro-batches of activations on stage s, so stage 0 the most.
"""
from __future__ import annotations

from source_code.memory import calculator, formula
from source_code.planner.spec import Config, Model, Precision, PRECISIONS

STRATEGY = calculator.ZERO


def stage_layers(layers: int, pp: int) -> list[int]:
    base, extra = divmod(layers, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]


def stage_params(model: Model, cfg: Config, stage: int) -> int:
    """Parameters one tp rank of pipeline stage ``stage`` holds before ZeRO sharding."""
    n = stage_layers(model.layers, cfg.pp)[stage]
    p = n * (-(-model.block_tp_sharded() // cfg.tp) + model.block_replicated())
    if stage == 0:
        p += model.embedding_params()
    if stage == cfg.pp - 1:
        p += model.head_params()
    return p


def block_bytes_per_token(model: Model, tp: int, prec: Precision, checkpointing: bool = False) -> float:
    """Activation bytes one block saves per token on one tp rank (memory.formula, on a GPU)."""
    return formula.block_bytes_per_token(model.hidden, model.heads, model.ffn_size, prec.mode,
                                         prec.activation, tp, checkpointing, device="cuda")


def head_bytes_per_token(model: Model, prec: Precision) -> float:
    """Final norm (input, output, statistics), log-softmax over the vocabulary, int64 ids.

    The log-softmax is counted at the activations' width (a fused cross-entropy that keeps it
    in fp32 adds 2 bytes per token and vocabulary entry in bf16: notebook 08's calculator
    counts it so, ``loss_bytes=4``)."""
    return formula.head_bytes_per_token(model.hidden, model.vocab, prec.mode, prec.activation, "cuda",
                                        loss_bytes=prec.activation)


def in_flight(cfg: Config, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once (1F1B)."""
    return min(cfg.pp - stage, cfg.micro_batches) if cfg.pp > 1 else 1


def activation_bytes(model: Model, cfg: Config, stage: int, prec: Precision) -> float:
    tokens = cfg.micro_batch * model.seq
    n = stage_layers(model.layers, cfg.pp)[stage]
    per_mb = n * block_bytes_per_token(model, cfg.tp, prec, cfg.checkpointing)
    if stage == cfg.pp - 1:
        per_mb += head_bytes_per_token(model, prec)
    total = in_flight(cfg, stage) * tokens * per_mb
    if cfg.checkpointing and n:  # the block being recomputed holds its full activations
        total += tokens * block_bytes_per_token(model, cfg.tp, prec)
    return total


def stage_bytes(model: Model, cfg: Config, stage: int, prec: Precision | str = "fp32") -> dict:
    """{"params", "grads", "optimizer", "activations", "buffers", "total"} of one GPU of a stage."""
    prec = PRECISIONS[prec] if isinstance(prec, str) else prec
    out = calculator.state_bytes(stage_params(model, cfg, stage), cfg.dp, cfg.zero, prec)
    del out["total"]
    out["activations"] = activation_bytes(model, cfg, stage, prec)
    # FSDP gathers a whole block (and prefetches the next) while computing it
    block = -(-model.block_tp_sharded() // cfg.tp) + model.block_replicated()
    out["buffers"] = calculator.gathered_block_bytes(block, cfg.zero, cfg.dp, prec)
    out["total"] = sum(out.values())
    return out


def per_gpu(model: Model, cfg: Config, prec: Precision | str = "fp32") -> dict:
    """The busiest pipeline stage's bytes, with "stage" naming it."""
    stages = [stage_bytes(model, cfg, s, prec) for s in range(cfg.pp)]
    worst = max(range(cfg.pp), key=lambda s: stages[s]["total"])
    return {**stages[worst], "stage": worst}
