"""Activation bytes of the workshop's TransformerLM, term by term, and the published rule of thumb.

    python -m source_code.memory.report      # counts them with saved-tensor hooks and compares

What autograd keeps for backward in one ``Block`` (source_code/models.py: pre-norm, separate
q/k/v/o projections, ``scaled_dot_product_attention``, an MLP of 4h with GELU), per token, with
h the hidden size and a the heads:

    term                              values   dtype                      cut by TP
    block input (norm1's input)       h        residual stream            no
    norm1 mean and 1/std              2        statistics                 no
    norm1 output (q, k, v's input)    h        compute (x3 under autocast) no
    q, k, v (for the attention)       3h       compute                    yes
    attention log-sum-exp             a        fp32 (flash kernels)       yes
    attention output (wo's input)     h        compute                    yes
    norm2 input (after the residual)  h        residual stream            no
    norm2 mean and 1/std              2        statistics                 no
    norm2 output (up's input)         h        compute                    no
    up output (GELU's input)          4h       compute                    yes
    GELU output (down's input)        4h       compute                    yes

The dtypes come from the precision mode: ``fp32`` computes everything in fp32; ``bf16`` (a
model cast to bf16, as Megatron-style mixed precision computes) keeps every activation in
16 bits, the LayerNorm statistics too on the CPU (fp32 on CUDA); ``autocast`` (fp32 weights,
``torch.autocast``) keeps the residual stream and LayerNorms in fp32, casts each linear
layer's input to 16 bits once per layer (three copies of norm1's output for q, k and v) and
saves a 16-bit copy of every weight matrix for the backward pass.

Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models",
count a Megatron block in 16 bits as s b h (34 + 5 a s / h) bytes: 34 s b h of which 2 are
dropout masks (we have none), and 5 a s^2 b for the s x s attention scores, their softmax and
its dropout mask, which a flash kernel never stores (it keeps the log-sum-exp: 4 a bytes a
token). They leave out the LayerNorm statistics (8 bytes a token in bf16 on the CPU).
"""
from __future__ import annotations

MODES = ("fp32", "bf16", "fp16", "autocast")
INT64 = 8
FP32 = 4


def _dtype_bytes(mode: str, act: int, device: str) -> dict:
    """Bytes of one value of each kind of saved tensor under ``mode``."""
    if mode not in MODES:
        raise ValueError(f"unknown precision mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "fp32":
        return {"residual": FP32, "stats": FP32, "compute": FP32, "lse": FP32}
    if mode == "autocast":  # LayerNorm runs in fp32 under autocast, the linear layers in 16 bits
        return {"residual": FP32, "stats": FP32, "compute": act, "lse": FP32}
    # a model in 16 bits: CUDA's LayerNorm keeps its statistics in fp32, the CPU's in 16 bits
    return {"residual": act, "stats": FP32 if device == "cuda" else act, "compute": act, "lse": FP32}


def block_terms(hidden: int, heads: int, ffn: int = 0, mode: str = "fp32", act: int = 2,
                device: str = "cpu", seq: int = 0) -> list[tuple[str, float, bool]]:
    """[(term, bytes per token, cut by tensor parallelism)] of one block, as in the table above.

    ``act``: bytes of a 16-bit value (2) when ``mode`` is not fp32. ``seq``: on CUDA an fp32
    attention runs the memory-efficient kernel, whose log-sum-exp is padded to a multiple of
    32 positions (give the sequence length to count that padding)."""
    h, f = hidden, ffn or 4 * hidden
    b = _dtype_bytes(mode, act, device)
    lse = heads * b["lse"]
    if device == "cuda" and mode == "fp32" and seq:
        lse = lse * (-(-seq // 32) * 32) / seq
    copies = 3 if mode == "autocast" else 1  # each of wq, wk, wv casts its own copy of its input
    return [("block input", h * b["residual"], False),
            ("norm1 statistics", 2 * b["stats"], False),
            ("norm1 output", copies * h * b["compute"], False),
            ("q, k, v", 3 * h * b["compute"], True),
            ("attention log-sum-exp", lse, True),
            ("attention output", h * b["compute"], True),
            ("norm2 input", h * b["residual"], False),
            ("norm2 statistics", 2 * b["stats"], False),
            ("norm2 output", h * b["compute"], False),
            ("up output (GELU input)", f * b["compute"], True),
            ("GELU output", f * b["compute"], True)]


def block_bytes_per_token(hidden: int, heads: int, ffn: int = 0, mode: str = "fp32", act: int = 2,
                          tp: int = 1, checkpointing: bool = False, device: str = "cpu",
                          seq: int = 0) -> float:
    """Bytes one block saves per token on one tensor-parallel rank (the planner uses this too).

    With activation checkpointing a block keeps only its input: h values of the residual stream."""
    if checkpointing:
        return hidden * _dtype_bytes(mode, act, device)["residual"]
    return sum(n / tp if cut else n for _, n, cut in block_terms(hidden, heads, ffn, mode, act, device, seq))


def block_weight_copies(hidden: int, ffn: int = 0, mode: str = "fp32", act: int = 2, tp: int = 1) -> float:
    """Bytes per block and forward that autocast saves as 16-bit copies of the weight matrices."""
    f = ffn or 4 * hidden
    return (4 * hidden * hidden + 2 * hidden * f) * act / tp if mode == "autocast" else 0


def head_bytes_per_token(hidden: int, vocab: int, mode: str = "fp32", act: int = 2,
                         device: str = "cpu", loss_bytes: int = FP32) -> float:
    """After the blocks, per token: the final norm (input, statistics, output), the log-softmax
    over the vocabulary (``loss_bytes`` a value: 4 when the loss is computed in fp32, as
    ``logits.float()`` does here), and the int64 input and target ids."""
    b = _dtype_bytes(mode, act, device)
    return (hidden * b["residual"] + 2 * b["stats"] + hidden * b["compute"]
            + vocab * loss_bytes + 2 * INT64)


def model_activation_bytes(batch: int, seq: int, hidden: int, layers: int, heads: int, vocab: int,
                           ffn: int = 0, mode: str = "fp32", act: int = 2, device: str = "cpu",
                           checkpointing: bool = False, loss_bytes: int = FP32) -> dict:
    """Bytes saved for backward by one forward + cross-entropy of a TransformerLM (its
    log-softmax kept in fp32, or at ``loss_bytes`` a value).

    Returns {"blocks", "head", "other", "total"}: the blocks (kept part only when
    ``checkpointing``), the final norm, log-softmax and ids, and the rest (int64 positions,
    the loss's fp32 total weight, autocast's copy of the head weight)."""
    tokens = batch * seq
    per_block = block_bytes_per_token(hidden, heads, ffn, mode, act, 1, checkpointing, device, seq)
    blocks = layers * (tokens * per_block
                       + (0 if checkpointing else block_weight_copies(hidden, ffn, mode, act)))
    head = tokens * head_bytes_per_token(hidden, vocab, mode, act, device, loss_bytes)
    other = INT64 * seq + FP32 + (vocab * hidden * act if mode == "autocast" else 0)
    return {"blocks": blocks, "head": head, "other": other, "total": blocks + head + other}


def korthikanti_block_bytes(batch: int, seq: int, hidden: int, heads: int) -> float:
    """The rule of thumb for one Megatron block in 16 bits: s b h (34 + 5 a s / h) bytes."""
    return seq * batch * hidden * (34 + 5 * heads * seq / hidden)


def korthikanti_differences(batch: int, seq: int, hidden: int, heads: int, device: str = "cpu") -> dict:
    """The rule minus our 16-bit block, term by term (bytes; they add up to the difference)."""
    sbh, sb = seq * batch * hidden, seq * batch
    stats = 2 * 2 * (FP32 if device == "cuda" else 2)
    return {"dropout masks (2 s b h, one byte each)": 2 * sbh,
            "attention scores, softmax, its dropout (5 a s^2 b)": 5 * heads * seq * seq * batch,
            "log-sum-exp of a flash kernel (4 a s b), not in the rule": -4 * heads * sb,
            "LayerNorm statistics, not in the rule": -stats * sb}
