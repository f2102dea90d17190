"""The memory calculator: bytes one GPU holds to train a TransformerLM, term by term.

    from source_code.memory.calculator import training_memory
    training_memory(n_params=6.7e9, layers=32, hidden=4096, heads=32, vocab=32000,
                    batch=1, seq=4096, precision="bf16", zero=3, dp=8, checkpointing=True)

One function for the parts the planner of notebook 12 shares (source_code/planner/memory.py,
mesh_memory.py, spec.py import them from here, so both give the same numbers):

* ``PRECISIONS``: bytes per parameter of the weights, their gradients and the optimizer state
  (AdamW: two moments, plus an fp32 master copy of the weights when the model computes in 16
  bits), and of an activation value. Each names the bookkeeping it assumes (``accounting``):
  bf16 mixed precision is "bf16" (the ZeRO paper's and DeepSpeed's, bf16 gradients, 16 bytes a
  parameter), "bf16-megatron" (fp32 main gradients, 18; with its distributed optimizer, ZeRO-1
  here, 6 + 12/d) or "bf16-fsdp2" (fp32 shards and gradients, bf16 all-gathers, 16);
* ``state_bytes``: those bytes per rank under a ZeRO stage (0 = DDP, 1 optimizer state, 2 +
  gradients, 3 = FSDP + parameters sharded over ``dp`` ranks, each tensor cut in chunks of
  ceil(n / dp), rank 0 holding the largest);
* activations per block: ``formula.block_bytes_per_token`` (counted term by term, checked
  against the bytes autograd saves);
* ``gathered_block_bytes``: FSDP's transient, one block all-gathered and the next prefetched.

``training_memory`` adds them up for one model on one data-parallel rank: what is held at the
start of backward, the usual peak of a step (the optimizer's own temporaries come later, when
the activations are gone).
"""
from __future__ import annotations

from dataclasses import dataclass

from source_code.memory import formula

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
ZERO = {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp"}
# which of the three states each strategy shards across the N ranks
SHARDED = {"ddp": set(), "zero1": {"optimizer"}, "zero2": {"optimizer", "grads"},
           "fsdp": {"optimizer", "grads", "params"}}


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each state, per activation / message value, and how activations
    are kept (a formula.MODES name). ``gathered``: bytes of a parameter value FSDP all-gathers
    (0: as kept, ``param``); ``accounting``: whose bookkeeping this is."""
    name: str
    param: int
    grad: int
    optimizer: int     # Adam's two moments (+ an fp32 master copy in mixed precision)
    activation: int
    mode: str = "fp32"
    gathered: int = 0
    accounting: str = ""

    @property
    def gather_bytes(self) -> int:
        return self.gathered or self.param


# Three bookkeepings of bf16 mixed precision, all with fp32 master weights and moments (12
# bytes, K = 12 in the ZeRO paper): where the gradients live differs (counted in
# memory/mixed_precision.py and memory/fsdp_bf16.py).
PRECISIONS = {
    "fp32": Precision("fp32", 4, 4, 8, 4, "fp32",                   # what the workshop runs on CPU
                      accounting="fp32 weights, gradients, AdamW moments"),
    "bf16": Precision("bf16", 2, 2, 12, 2, "bf16", accounting=(
        "the ZeRO paper's (DeepSpeed's): bf16 weights and gradients, fp32 master + moments "
        "(2+2+12); ZeRO-3 shards the bf16 weights")),
    "bf16-megatron": Precision("bf16-megatron", 2, 4, 12, 2, "bf16", accounting=(
        "Megatron-LM's: bf16 weights, fp32 main gradients, fp32 master + moments (2+4+12); "
        "its distributed optimizer is ZeRO-1 here: 6 + 12/d")),
    "bf16-fsdp2": Precision("bf16-fsdp2", 4, 4, 8, 2, "bf16", gathered=2, accounting=(
        "FSDP2 with MixedPrecisionPolicy(bf16, reduce fp32): fp32 shards (the master copy), "
        "fp32 gradients and moments (4+4+8), bf16 all-gathers")),
    "fp16": Precision("fp16", 2, 2, 12, 2, "fp16",                  # the same bytes, plus a loss scale
                      accounting="as bf16, plus a loss scale"),
    "autocast": Precision("autocast", 4, 4, 8, 2, "autocast",       # fp32 weights, torch.autocast(bf16)
                          accounting="fp32 weights, gradients, moments; bf16 matmuls"),
    "bf16-pure": Precision("bf16-pure", 2, 2, 4, 2, "bf16",         # everything in bf16, no master copy
                           accounting="bf16 weights, gradients and moments, no master copy"),
}


def as_precision(p: Precision | str) -> Precision:
    if isinstance(p, Precision):
        return p
    if p not in PRECISIONS:
        raise ValueError(f"unknown precision {p!r}; choose one of {', '.join(PRECISIONS)}")
    return PRECISIONS[p]


def strategy(zero: int | str) -> str:
    name = ZERO.get(zero, zero)
    if name not in SHARDED:
        raise ValueError(f"unknown strategy {zero!r}; choose a ZeRO stage 0-3 or one of {', '.join(STRATEGIES)}")
    return name


def shard_numel(numel: int, world_size: int) -> int:
    """Elements of the largest (rank 0's) chunk when ``numel`` is cut into world_size chunks."""
    return -(-numel // world_size)


def state_bytes(numels, world_size: int, zero: int | str, prec: Precision | str = "fp32",
                step_bytes: int = 0) -> dict:
    """Bytes rank 0 keeps for parameters, gradients and optimizer state between steps.

    ``numels``: one number (P, treated as one tensor) or the sizes of the parameter tensors.
    ``step_bytes``: AdamW's step counter per tensor (4 bytes each in torch, on every rank).
    Returns {"params", "grads", "optimizer", "total"} in bytes."""
    prec, sharded = as_precision(prec), SHARDED[strategy(zero)]
    numels = [int(numels)] if isinstance(numels, (int, float)) else [int(n) for n in numels]
    full = sum(numels)
    shard = sum(shard_numel(n, world_size) for n in numels)

    def held(what):
        return shard if what in sharded else full

    out = {"params": held("params") * prec.param, "grads": held("grads") * prec.grad,
           "optimizer": held("optimizer") * prec.optimizer + step_bytes * len(numels)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def gathered_block_bytes(block_params: int, zero: int | str, dp: int, prec: Precision | str) -> int:
    """FSDP's transient: one block all-gathered while it computes, the next one prefetched."""
    return 2 * block_params * as_precision(prec).gather_bytes if strategy(zero) == "fsdp" and dp > 1 else 0


def block_params(hidden: int, ffn: int = 0) -> int:
    """Parameters of one Block: q, k, v, o; up and down with biases; two LayerNorms."""
    f = ffn or 4 * hidden
    return 4 * hidden * hidden + 2 * hidden * f + f + hidden + 4 * hidden


def dims_of(model) -> dict:
    """The calculator's arguments read from a source_code.models.TransformerLM."""
    block = model.layers[0]
    return {"n_params": [p.numel() for p in model.parameters()], "layers": len(model.layers),
            "hidden": model.tok.embedding_dim, "heads": block.attn.n_heads,
            "vocab": model.tok.num_embeddings, "ffn": block.mlp.up.out_features}


def training_memory(n_params, layers: int, hidden: int, heads: int, vocab: int, batch: int, seq: int,
                    precision: str = "fp32", zero: int | str = 0, dp: int = 1,
                    checkpointing: bool = False, ffn: int = 0, device: str = "cpu",
                    step_bytes: int = 0, loss_bytes: int = 4) -> dict:
    """Bytes one data-parallel rank holds at the start of backward, by term.

    {"params", "grads", "optimizer", "activations", "buffers", "total"}; gradients are counted
    as held (zero_grad(set_to_none=False), or the step's own accumulating gradients), ``batch``
    is the rank's micro-batch. With ``checkpointing`` the activations are the blocks' inputs
    plus one block recomputed in full during its backward. ``loss_bytes``: bytes of a value of
    the log-softmax over the vocabulary (4: the loss computed in fp32; the planner assumes the
    activations' width). ``device``: "cuda" keeps LayerNorm statistics in fp32 in 16-bit modes."""
    if min(layers, hidden, heads, vocab, batch, seq, dp) < 1 or layers != int(layers):
        raise ValueError(f"layers={layers}, hidden={hidden}, heads={heads}, vocab={vocab}, batch={batch}, "
                         f"seq={seq}, dp={dp}: every size must be a positive integer")
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}; choose a multiple of the heads")
    prec = as_precision(precision)
    out = dict(state_bytes(n_params, dp, zero, prec, step_bytes))
    out.pop("total")
    act = formula.model_activation_bytes(batch, seq, hidden, layers, heads, vocab, ffn, prec.mode,
                                         prec.activation, device, checkpointing, loss_bytes)["total"]
    if checkpointing and layers:
        act += batch * seq * formula.block_bytes_per_token(hidden, heads, ffn, prec.mode,
                                                            prec.activation, device=device, seq=seq)
        act += formula.block_weight_copies(hidden, ffn, prec.mode, prec.activation)
    out["activations"] = act
    out["buffers"] = gathered_block_bytes(block_params(hidden, ffn), zero, dp, prec)
    out["total"] = sum(out.values())
    return out
