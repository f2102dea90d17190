"""Checks of the tensor-parallel model against the dense one, run on every rank.

* ``parity(workload, sequence_parallel)``: one forward + backward of the dense TransformerLM
  and of its TP copy on the same batch; max |difference| of logits, loss and every gradient
  (each TP gradient against its slice of the dense gradient), and the ledger of collectives.
* ``saved_bytes(model, tokens)``: bytes of the activations autograd keeps for backward,
  split into the LayerNorm regions, the column layers' inputs and the rest (sequence
  parallelism shrinks the first two by n).

    from source_code.processes import spawn
    spawn(parity, 2, Workload(), False, device="cpu")     # one dict per rank

Every check computes where the process group's Context says (``distributed.context().device``):
the CPU when the notebook spawns with ``device="cpu"``, this rank's GPU under torchrun on a GPU
node, with TF32 off there (``device_policy.exact_math``) and the tolerance of ``tolerance``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from source_code import device_policy, models
from source_code.distributed import context
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


def on_device(work: Workload):
    """(dense model, inputs, targets) of ``work`` on this rank's device (``context().device``);
    on a GPU the math is made exact first (TF32 off), as every parity check needs."""
    device = context().device
    if device.type == "cuda":
        device_policy.exact_math()
    x, y = work.batch_tensors()
    return work.model().to(device), x.to(device), y.to(device)


def tolerance(device) -> float:
    """The max |difference| a TP parity check accepts on ``device`` (logits, loss, gradients).

    CPU: 1e-5, fp32 sums of the same numbers in another order (a split matmul adds n partial
    sums; the dense one adds them in one loop). CUDA, TF32 off: 1e-4. cuBLAS picks other
    kernels (another blocking, split-K) for a slice than for the whole matrix, and NCCL adds
    the partial sums of 3 or more ranks in ring or tree order, which differs from rank to rank
    and from the order of the dense sum; errors of a few fp32 ulps of the O(1) logits then add
    up over the blocks and through the backward."""
    return 1e-4 if torch.device(device).type == "cuda" else 1e-5


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
    dense, x, y = on_device(work)
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
            "grad_diff": max(grads.values()), "grad_diffs": grads, "logits_shape": tuple(logits.shape),
            "calls": ledger.calls, "table": ledger.table(), "workload": asdict(work),
            "layout": layout(dense, tp), "device": x.device.type, "tol": tolerance(x.device)}


def layout(dense: nn.Module, tp: nn.Module) -> dict:
    """name -> (dense shape, owner) read from the sharded module: ("rows"|"columns", lo, hi),
    or None for a parameter every rank holds whole."""
    shapes = {n: tuple(p.shape) for n, p in dense.named_parameters()}
    return {n: (shapes[n], getattr(p, "owner", None)) for n, p in tp.named_parameters()}


def saved_bytes(model: nn.Module, tokens: torch.Tensor) -> dict:
    """Bytes of the activations saved for backward during one forward, by region.

    * "layernorm": saved while a LayerNorm module runs (its input, mean and 1/std);
    * "linear_input": a tensor that shares its storage with the output of a block's LayerNorm,
      i.e. what the column-parallel layers (q/k/v, MLP up) keep as their input: the full
      (b, t, d) in TP, the (b, t/n, d) shard in TP + SP;
    * "other": everything else (inside the TP region, attention, the head).
    Parameters are not activations and are left out; a tensor saved twice counts once."""
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, out = set(), {"layernorm": 0, "linear_input": 0, "other": 0}
    region, norm_outputs = ["other"], set()

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key[0] not in param_storages and key not in seen:
            seen.add(key)
            where = "linear_input" if key[0] in norm_outputs and region[0] == "other" else region[0]
            out[where] += t.numel() * t.element_size()
        return t

    def after_norm(module, args, output, in_block):
        region[0] = "other"
        if in_block:
            norm_outputs.add(output.untyped_storage().data_ptr())

    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    hooks = [m.register_forward_pre_hook(lambda *_: region.__setitem__(0, "layernorm")) for _, m in norms]
    hooks += [m.register_forward_hook(lambda mod, a, o, b=n.startswith("layers."): after_norm(mod, a, o, b))
              for n, m in norms]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(tokens)
    finally:
        for h in hooks:
            h.remove()
    del logits
    out["total"] = sum(out.values())
    return out


def activation_bytes(work: Workload) -> dict:
    """Run on every rank: saved-activation bytes of dense, TP and TP+SP for one forward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dense, x, _ = on_device(work)
    with comm.counting():  # keep the ledger of other code clean
        return {"rank": rank, "world": world, "dense": saved_bytes(dense, x),
                "tp": saved_bytes(TPTransformerLM(dense, rank, world, False), x),
                "sp": saved_bytes(TPTransformerLM(dense, rank, world, True), x)}


def report(work: Workload) -> dict:
    """Run on every rank: parity and ledger of plain TP and of TP + SP, and saved-activation bytes
    (one spawn for the tests and the notebook)."""
    return {"tp": parity(work, False), "sp": parity(work, True), "activations": activation_bytes(work),
            "vp": parity(work, False, True), "sp_vp": parity(work, True, True)}
