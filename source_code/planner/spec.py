"""What the planner reasons about: a model, a cluster, a parallel configuration, a precision.

The model family is the workshop's TransformerLM (source_code/models.py) at any size: token and
position embeddings, ``layers`` pre-norm blocks (q, k, v, o projections; an MLP of two matrices
with biases; two LayerNorms), a final LayerNorm and an untied head. Named sizes:

    workshop   the TransformerLM the notebooks train (dim 64, 2 layers, vocab 32, seq 32)
    7b         32 layers, hidden 4096, 32 heads, vocab 32000, seq 4096   (6.7e9 parameters)
    70b        80 layers, hidden 8192, 64 heads, vocab 32000, seq 4096   (65e9 parameters)

A configuration is a mesh (pp, dp, tp) with tp varying fastest (a tp group = consecutive ranks,
inside a node), pp slowest; plus the ZeRO stage of the dp dimension (0 = DDP, 1, 2, 3 = FSDP),
the micro-batch size and activation checkpointing on/off.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from source_code.memory.calculator import PRECISIONS as CALCULATOR_PRECISIONS, Precision  # noqa: F401

GB = 1e9


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    ffn: int = 0             # MLP hidden size (0: 4 x hidden)
    max_len: int = 0         # rows of the learned position table (0: none, e.g. rotary)
    fused_qkv: bool = True   # one qkv matrix: 2 TP all-reduces per block backward; separate: 4

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    # parameters, split the way tensor parallelism splits them
    def block_tp_sharded(self) -> int:
        """Per block, cut by TP: q, k, v, o (4 h^2), up and down (2 h ffn), the up bias."""
        h, f = self.hidden, self.ffn_size
        return 4 * h * h + 2 * h * f + f

    def block_replicated(self) -> int:
        """Per block, whole on every tp rank: the down bias and two LayerNorms."""
        return self.hidden + 4 * self.hidden

    def block_params(self) -> int:
        return self.block_tp_sharded() + self.block_replicated()

    def embedding_params(self) -> int:
        return (self.vocab + self.max_len) * self.hidden

    def head_params(self) -> int:
        """Final LayerNorm + untied LM head."""
        return 2 * self.hidden + self.vocab * self.hidden

    def params(self) -> int:
        return self.layers * self.block_params() + self.embedding_params() + self.head_params()

    def flops_per_token(self) -> float:
        """Forward + backward: 6 per parameter, plus the attention scores (12 L s h)."""
        return 6 * self.params() + 12 * self.layers * self.seq * self.hidden


PRESETS = {
    "workshop": Model("workshop", layers=2, hidden=64, heads=4, vocab=32, seq=32, max_len=64,
                      fused_qkv=False),
    "7b": Model("7b", layers=32, hidden=4096, heads=32, vocab=32000, seq=4096),
    "70b": Model("70b", layers=80, hidden=8192, heads=64, vocab=32000, seq=4096),
}


def model_from(name: str = "", params: float = 0, layers: int = 0, hidden: int = 0,
               heads: int = 0, seq: int = 0, vocab: int = 32000) -> Model:
    """A named preset with any dimension overridden, or a model from its dimensions.

    With ``params`` and no preset, the blocks are sized from layers/hidden and the rest of
    the count is taken as vocabulary (embedding + head); too small a count is an error."""
    if name:
        if name not in PRESETS:
            raise ValueError(f"unknown model {name!r}; choose one of {', '.join(PRESETS)} or give dimensions")
        m = PRESETS[name]
        dims = {k: v for k, v in dict(layers=layers, hidden=hidden, heads=heads, seq=seq).items() if v}
        return replace(m, **dims)
    if not (layers and hidden):
        raise ValueError("give a model: --model NAME, or --layers and --hidden (and --params)")
    m = Model("custom", layers=layers, hidden=hidden, heads=heads or max(1, hidden // 128),
              vocab=vocab, seq=seq or 2048)
    if params:
        rest = params - layers * m.block_params() - 2 * hidden
        if rest < 0:
            raise ValueError(f"{params:.3g} parameters are fewer than {layers} blocks of hidden "
                             f"{hidden} hold ({layers * m.block_params():.3g}); check --params")
        m = replace(m, vocab=max(1, int(rest // (2 * hidden))))
    return m


# bytes per parameter and per activation: one table for notebooks 08 and 12
# (source_code/memory/calculator.py); the planner offers fp32 and the bookkeepings of bf16 mixed
# precision: "bf16" the ZeRO paper's / DeepSpeed's (bf16 gradients, the default), Megatron-LM's
# (fp32 main gradients) and FSDP2's (fp32 shards, bf16 all-gathers); each names itself
PRECISIONS = {k: CALCULATOR_PRECISIONS[k] for k in ("fp32", "bf16", "bf16-megatron", "bf16-fsdp2")}


@dataclass(frozen=True)
class Cluster:
    gpus: int
    gpus_per_node: int
    gpu_mem_gb: float
    intra_gbps: float = 100.0    # GB/s per GPU inside a node (NVLink / Infinity Fabric)
    inter_gbps: float = 12.5     # GB/s per GPU between nodes (network share)
    usable: float = 0.9          # fraction of GPU memory a plan may fill
    tflops: float = 100.0        # TFLOP/s one GPU sustains on the model (peak x utilisation)


@dataclass(frozen=True)
class Config:
    dp: int
    tp: int = 1
    pp: int = 1
    zero: int = 0               # 0 DDP, 1, 2, 3 (= FSDP)
    micro_batch: int = 1
    global_batch: int = 0       # sequences per step (0: dp x micro_batch, one micro-batch)
    checkpointing: bool = False

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step on each pipeline (gradient accumulation when pp = 1)."""
        return max(1, (self.global_batch or self.dp * self.micro_batch) // (self.dp * self.micro_batch))

    def label(self) -> str:
        strategy = {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp"}[self.zero]
        return (f"dp{self.dp}({strategy}) x tp{self.tp} x pp{self.pp}, mb{self.micro_batch}"
                + (" +ckpt" if self.checkpointing else ""))
