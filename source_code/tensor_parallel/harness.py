"""Checks of the tensor-parallel model against the dense one, run on every rank.

* ``parity(workload, sequence_parallel)``: one forward + backward of the dense TransformerLM
  and of its TP copy on the same batch; max |difference| of logits, loss and every gradient
  (each TP gradient against its slice of the dense gradient), and the ledger of collectives.
* ``saved_bytes(model, tokens)``: bytes of the activations autograd keeps for backward,
  split into the LayerNorm regions and the rest (sequence parallelism shrinks the former).

    from source_code.processes import spawn
    spawn(parity, 2, Workload(), False, device="cpu")     # one dict per rank
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from source_code import models
from source_code.tensor_parallel import comm
from source_code.tensor_parallel.model import TPTransformerLM, dense_slice


@dataclass(frozen=True)
class Workload:
    """A tiny TransformerLM and one batch: seconds on 2 CPU cores, every rank builds the same."""
    vocab: int = 32
    dim: int = 32
    heads: int = 4
    layers: int = 2
    seq: int = 16
    batch: int = 4
    seed: int = 0

    def model(self) -> models.TransformerLM:
        torch.manual_seed(self.seed)
        return models.TransformerLM(vocab_size=self.vocab, dim=self.dim, n_layers=self.layers,
                                    n_heads=self.heads, max_len=self.seq)

    def batch_tensors(self, step: int = 0):
        g = torch.Generator().manual_seed(self.seed + 1000 + step)
        tokens = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]          # inputs, next-token targets


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def grad_diffs(dense: nn.Module, tp: nn.Module) -> dict:
    """name -> max |tp grad - its slice of the dense grad|."""
    dense_params = dict(dense.named_parameters())
    return {name: max_diff(p.grad, dense_slice(dense_params[name].grad, p))
            for name, p in tp.named_parameters()}


def parity(work: Workload, sequence_parallel: bool = False, vocab_parallel: bool = False) -> dict:
    """Run on every rank of a group: dense vs TP, one forward and backward. With
    ``vocab_parallel`` the logits of my slice of the vocabulary are compared."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dense = work.model()
    x, y = work.batch_tensors()
    ref_logits = dense(x)
    ref_loss = lm_loss(ref_logits, y)
    ref_loss.backward()

    tp = TPTransformerLM(dense, rank, world, sequence_parallel, vocab_parallel)
    with comm.counting() as ledger:
        logits = tp(x)
        loss = tp.loss(logits, y)
        loss.backward()
        tp.sync_sp_grads()
    grads = grad_diffs(dense, tp)
    if vocab_parallel:
        ref_logits = dense_slice(ref_logits.transpose(0, -1), tp.head.weight).transpose(0, -1)
    return {"rank": rank, "world": world, "sequence_parallel": sequence_parallel,
            "logits_diff": max_diff(logits, ref_logits), "loss_diff": max_diff(loss, ref_loss),
            "grad_diff": max(grads.values()), "grad_diffs": grads,
            "calls": ledger.calls, "table": ledger.table(), "workload": asdict(work),
            "layout": layout(dense, tp)}


def layout(dense: nn.Module, tp: nn.Module) -> dict:
    """name -> (dense shape, owner) read from the sharded module: ("rows"|"columns", lo, hi),
    or None for a parameter every rank holds whole."""
    shapes = {n: tuple(p.shape) for n, p in dense.named_parameters()}
    return {n: (shapes[n], getattr(p, "owner", None)) for n, p in tp.named_parameters()}


def saved_bytes(model: nn.Module, tokens: torch.Tensor) -> dict:
    """Bytes of the activations saved for backward during one forward, by region.

    A tensor saved while a LayerNorm module runs counts to "layernorm"; everything else to
    "other". Parameters are not activations and are left out; a tensor saved twice counts once."""
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, out = set(), {"layernorm": 0, "other": 0}
    region = ["other"]

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key[0] not in param_storages and key not in seen:
            seen.add(key)
            out[region[0]] += t.numel() * t.element_size()
        return t

    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    hooks = [m.register_forward_pre_hook(lambda *_: region.__setitem__(0, "layernorm")) for m in norms]
    hooks += [m.register_forward_hook(lambda *_: region.__setitem__(0, "other")) for m in norms]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(tokens)
    finally:
        for h in hooks:
            h.remove()
    del logits
    out["total"] = out["layernorm"] + out["other"]
    return out


def activation_bytes(work: Workload) -> dict:
    """Run on every rank: saved-activation bytes of dense, TP and TP+SP for one forward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dense = work.model()
    x, _ = work.batch_tensors()
    with comm.counting():  # keep the ledger of other code clean
        return {"rank": rank, "world": world, "dense": saved_bytes(dense, x),
                "tp": saved_bytes(TPTransformerLM(dense, rank, world, False), x),
                "sp": saved_bytes(TPTransformerLM(dense, rank, world, True), x)}


def report(work: Workload) -> dict:
    """Run on every rank: parity and ledger of plain TP and of TP + SP, and saved-activation bytes
    (one spawn for the tests and the notebook)."""
    return {"tp": parity(work, False), "sp": parity(work, True), "activations": activation_bytes(work),
            "vp": parity(work, False, True), "sp_vp": parity(work, True, True)}
