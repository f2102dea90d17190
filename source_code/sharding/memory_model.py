"""Bytes per rank of parameters, gradients, optimizer state and activations, per strategy.

    python -m source_code.sharding.memory_report      # these predictions beside counted bytes

Notebook 09's arithmetic, in its own package; the planner (notebook 12) re-exports it from
source_code/planner/memory.py and adds its command line.

The arithmetic of data parallelism with sharding (Rajbhandari et al., "ZeRO", 2020), for a
model of P parameters trained in fp32 with Adam/AdamW on N ranks:

    strategy   parameters   gradients   optimizer state (exp_avg + exp_avg_sq)
    ddp        P            P           2P
    zero1      P            P           2P / N
    zero2      P            P / N       2P / N
    fsdp       P / N        P / N       2P / N        (ZeRO-3; reshard on or off)

times 4 bytes each. "Per rank" means what a rank keeps between steps (after optimizer.step(),
before zero_grad()); the peak during a step adds transient buffers (FSDP's all-gathered block,
a gradient being reduce-scattered) and the activations.

Sharding is per tensor, as in FSDP2 and in ZeRO by hand (source_code/sharding/zero.py): each
tensor of n elements is cut into N chunks of ceil(n / N), so rank 0 holds the largest shard;
``state_bytes`` takes the list of tensor sizes to predict that exactly. AdamW also keeps one
float32 ``step`` counter per parameter tensor on every rank (4 bytes each, not sharded).

Activations (``activation_bytes``) are the tensors autograd saves for backward, counted term by
term for source_code.models.TransformerLM with torch's CPU flash-attention kernel (which saves
the log-sum-exp per head and position, not the t x t attention matrix).
"""
from __future__ import annotations

# one calculator for the notebooks of memory (08), sharding (09) and the planner (12): the ZeRO
# bookkeeping and the activation formula live in source_code/memory/
from source_code.memory.calculator import SHARDED, STRATEGIES, Precision, shard_numel
from source_code.memory import calculator, formula


def state_bytes(numels, world_size: int, strategy: str, bytes_per_value: int = 4,
                adam_states: int = 2, step_bytes: int = 4) -> dict:
    """Predicted bytes that rank 0 keeps for parameters, gradients and optimizer state.

    ``numels``: one int (P, treated as a single tensor) or the sizes of the parameter tensors.
    Returns {"params", "grads", "optimizer", "total"} in bytes (memory.calculator.state_bytes
    with ``bytes_per_value`` for every state).
    """
    prec = Precision("custom", bytes_per_value, bytes_per_value, adam_states * bytes_per_value,
                     bytes_per_value)
    return calculator.state_bytes(numels, world_size, strategy, prec, step_bytes)


def activation_bytes(batch: int, seq_len: int, dim: int, n_layers: int, n_heads: int,
                     vocab: int, bytes_per_value: int = 4) -> int:
    """Bytes autograd saves for backward in one TransformerLM forward + cross-entropy.

    Per token and block: the block input, LayerNorm output and its 2 statistics (twice), q, k,
    v, the attention output, one log-sum-exp per head, the MLP's up projection and its GELU
    (4 x dim each): 16 dim + heads + 4 values. Per token after the blocks: the final norm's
    input, output and statistics (2 dim + 2), the log-softmax over the vocabulary, and the int64
    input and target ids (2 values each). Plus the int64 positions (8 bytes each) and the loss.
    Term by term in source_code/memory/formula.py (fp32, or a 16-bit model on the CPU).
    """
    mode = "fp32" if bytes_per_value == 4 else "bf16"
    return int(formula.model_activation_bytes(batch, seq_len, dim, n_layers, n_heads, vocab,
                                              mode=mode, act=bytes_per_value)["total"])


def communication_bytes(n_params: int, world_size: int, strategy: str,
                        reshard_after_forward: bool = True, bytes_per_value: int = 4) -> float:
    """Bytes each rank sends per training step, with ring/bandwidth-optimal collectives.

    all-reduce of S bytes: 2(N-1)/N S; all-gather or reduce-scatter of S bytes (the full
    tensor): (N-1)/N S. DDP: one all-reduce of the gradients. ZeRO-1 (as written here): all-reduce
    of the gradients + all-gather of the updated parameters. ZeRO-2: reduce-scatter + all-gather.
    FSDP: all-gather in forward, again in backward (unless reshard_after_forward=False kept the
    parameters), reduce-scatter of the gradients.
    """
    n = world_size
    s = n_params * bytes_per_value
    unit = (n - 1) / n * s
    if strategy == "ddp":
        return 2 * unit
    if strategy == "zero1":
        return 3 * unit
    if strategy == "zero2":
        return 2 * unit
    if strategy == "fsdp":
        return (3 if reshard_after_forward else 2) * unit
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def table(n_params: int, world_sizes=(1, 2, 4, 8)) -> list[str]:
    """Predicted per-rank state for every strategy and world size, as text lines."""
    lines = [f"P = {n_params:,d} parameters, fp32 + AdamW; per-rank state in MiB "
             "(params + grads + optimizer = total)"]
    for n in world_sizes:
        for s in STRATEGIES:
            b = state_bytes(n_params, n, s, step_bytes=0)
            lines.append(f"N={n:<3d} {s:6s} " + " + ".join(
                f"{b[k] / 2**20:9.2f}" for k in ("params", "grads", "optimizer"))
                + f" = {b['total'] / 2**20:9.2f}")
    return lines
