"""The TransformerLM of source_code/models.py, tensor-parallel, built from a dense model's weights.

Per block (Megatron's layout):

    attention: x -> [copy_to_tp] -> wq, wk, wv column-parallel: my n_heads/n heads
                  -> causal attention on my heads only -> wo row-parallel -> [reduce_from_tp]
    MLP:       x -> [copy_to_tp] -> up column-parallel -> GELU on my slice
                  -> down row-parallel -> [reduce_from_tp]

so one all-reduce forward and one backward for each of the two: 2 + 2 per block. LayerNorms,
embeddings, the residual stream and the head stay replicated (every rank computes them).

With ``sequence_parallel=True`` the replicated part is sharded along the sequence instead:
the embeddings are cut to my t/n tokens (``scatter_to_sp``), each LayerNorm and residual add
sees t/n tokens, the column layers all-gather their input (keeping only the t/n-token shard
for backward, which gathers it again) and the row layers reduce-scatter their output; before
the head the sequence is gathered again (``gather_to_full``). The parameters that saw only
t/n tokens (LayerNorms, row biases) are marked ``sp_partial_grad``: ``sync_sp_grads`` sums
their gradients after backward.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from source_code import models
from source_code.tensor_parallel import comm
from source_code.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, sp_column_linears
from source_code.tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy


def _replicate(module: nn.Module) -> nn.Module:
    """A copy of a small dense module (LayerNorm, Embedding, head): every rank holds all of it."""
    return copy.deepcopy(module)


class TPAttention(nn.Module):
    def __init__(self, dense: models.Attention, rank: int, world: int, sp: bool, tag: str):
        super().__init__()
        if dense.n_heads % world:
            raise ValueError(f"{dense.n_heads} heads do not split over {world} ranks")
        self.head_dim = dense.wq.in_features // dense.n_heads
        # q, k, v column-parallel: rows of W_q are grouped by head, so my rows = my heads
        self.wq, self.wk, self.wv = (ColumnParallelLinear(w, rank, world, sp, f"{tag}.qkv")
                                     for w in (dense.wq, dense.wk, dense.wv))
        self.wo = RowParallelLinear(dense.wo, rank, world, sp, f"{tag}.attn")

    def forward(self, x):
        # one copy_to_tp (or all-gather) for q, k and v together: they read the same x
        qkv = (self.wq, self.wk, self.wv)
        if self.wq.sequence_parallel:    # all-gather, keep the (b, t/n, d) shard for backward
            outs = sp_column_linears(x, qkv, self.wq.tag)
        else:
            x_in = comm.copy_to_tp(x, self.wq.tag)
            outs = [F.linear(x_in, w.weight) for w in qkv]
        b, t, _ = outs[0].shape                                   # (b, t, d/n) each
        q, k, v = (o.view(b, t, -1, self.head_dim).transpose(1, 2) for o in outs)  # (b, heads/n, t, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))       # (b, t, d) or (b, t/n, d)


class TPMLP(nn.Module):
    def __init__(self, dense: models.MLP, rank: int, world: int, sp: bool, tag: str):
        super().__init__()
        self.up = ColumnParallelLinear(dense.up, rank, world, sp, f"{tag}.mlp-in")
        self.down = RowParallelLinear(dense.down, rank, world, sp, f"{tag}.mlp")

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))    # GELU acts on my slice of the hidden units


class TPBlock(nn.Module):
    def __init__(self, dense: models.Block, rank: int, world: int, sp: bool = False, tag: str = ""):
        super().__init__()
        self.norm1, self.norm2 = _replicate(dense.norm1), _replicate(dense.norm2)
        self.attn = TPAttention(dense.attn, rank, world, sp, tag)
        self.mlp = TPMLP(dense.mlp, rank, world, sp, tag)
        if sp:
            for p in [*self.norm1.parameters(), *self.norm2.parameters(), self.attn.wo.bias,
                      self.mlp.down.bias]:
                if p is not None:
                    p.sp_partial_grad = True

    def forward(self, x):                       # (b, t, d) TP; (b, t/n, d) SP
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TPTransformerLM(nn.Module):
    """Same forward as models.TransformerLM, blocks tensor-parallel over the default group."""

    def __init__(self, dense: models.TransformerLM, rank: int, world: int,
                 sequence_parallel: bool = False, vocab_parallel: bool = False):
        super().__init__()
        self.sequence_parallel = sp = sequence_parallel
        self.vocab_parallel = vocab_parallel
        self.tok, self.pos = _replicate(dense.tok), _replicate(dense.pos)
        if vocab_parallel:  # token table and head split over the vocabulary (vocab.py)
            self.tok = VocabParallelEmbedding(dense.tok, rank, world, sp)
        self.layers = nn.ModuleList(TPBlock(b, rank, world, sp, tag=f"block{i}")
                                    for i, b in enumerate(dense.layers))
        self.norm, self.head = _replicate(dense.norm), _replicate(dense.head)
        if vocab_parallel:
            self.head = ColumnParallelLinear(dense.head, rank, world, sp, "head")
        self.world = world
        if sp:
            for p in self.norm.parameters():
                p.sp_partial_grad = True
            if vocab_parallel:  # the position table saw t/n positions per rank
                self.pos.weight.sp_partial_grad = True

    def forward(self, tokens):                   # tokens: (b, t), the same on every rank
        t = tokens.shape[1]
        if self.sequence_parallel and t % self.world:
            raise ValueError(f"sequence length {t} does not split over {self.world} ranks")
        pos = self.pos(torch.arange(t, device=tokens.device))                    # (t, d)
        if self.vocab_parallel:   # the embedding's sum over ranks (or its reduce-scatter) is the border
            x = self.tok(tokens)                                                  # (b, t or t/n, d)
            x = x + (comm.my_slice_seq(pos.unsqueeze(0)) if self.sequence_parallel else pos)
        else:
            x = self.tok(tokens) + pos                                            # (b, t, d)
            if self.sequence_parallel:
                x = comm.scatter_to_sp(x, "embed")    # (b, t/n, d); backward: all-gather
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        if self.vocab_parallel:
            return self.head(x)                        # (b, t, vocab/n): my tokens' logits
        if self.sequence_parallel:
            x = comm.gather_to_full(x, "head")         # (b, t, d); backward: my slice
        return self.head(x)                            # (b, t, vocab) on every rank

    def loss(self, logits, targets):
        """Mean next-token cross-entropy (-100 ignored), from full or vocabulary-split logits."""
        if self.vocab_parallel:
            return vocab_parallel_cross_entropy(logits, targets, self.head.weight.owner[1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)

    def sync_sp_grads(self) -> None:
        """After backward, with sequence parallelism: sum the grads of the t/n-token parameters."""
        if self.sequence_parallel:
            comm.all_reduce_grads([p for p in self.parameters() if getattr(p, "sp_partial_grad", False)])


def dense_slice(tensor: torch.Tensor, param: nn.Parameter) -> torch.Tensor:
    """The part of a dense tensor (a weight or its gradient) that the TP parameter ``param`` holds.

    TP parameters carry the dense model's names (layers.0.attn.wq.weight, ...); ``owner`` says
    which rows or columns of the dense matrix they are."""
    owner = getattr(param, "owner", None)
    if owner is None:
        return tensor
    kind, lo, hi = owner
    return tensor[lo:hi] if kind == "rows" else tensor[:, lo:hi]
