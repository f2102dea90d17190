"""The one-process reference every mesh must equal: the whole global batch, one model.

The loss of a step is the summed cross-entropy of the global batch / its number of scored
targets (``workload.lm_loss``). Split any way (dp slices, microbatches), each piece
computes the same sum over its samples divided by the same global count, so the pieces'
gradients ADD UP to the reference gradient: data parallelism sums them (an all-reduce SUM, or
FSDP2's average x dp), the pipeline schedule accumulates microbatches.

The reference runs on the same device as the mesh (``distributed.context().device``); on a GPU
``exact`` turns TF32 off first (``device_policy.exact_math``), and ``tolerance`` is wider.
"""
from __future__ import annotations

import torch

from source_code import device_policy
from source_code.workload import lm_loss
from source_code import workload


def batches(steps: int, batch_size: int, seed: int = 0, n: int = 256):
    """The global batches of ``steps`` steps of the sort task: [(x (B, T), y (B, T)), ...]."""
    dataset = workload.sort_task(n=n)
    return [workload.global_batch(dataset, s, batch_size, seed) for s in range(steps)]


def n_valid(y: torch.Tensor) -> int:
    return int((y != -100).sum())


def exact(device) -> float:
    """Ready ``device`` for a parity run (TF32 off on a GPU); returns the weight tolerance.

    CPU: 1e-6 (3 SGD steps of an fp32 model whose sums are split and added in another order).
    CUDA: 1e-5. With TF32 off the matmuls are fp32, but cuBLAS picks other kernels (blocking,
    split-K) for a weight's shard than for the whole matrix, and NCCL adds the contributions of
    3 or more ranks in ring or tree order, unlike the reference's one sum: a few fp32 ulps per
    sum, carried through the backward and the momentum of every step."""
    if torch.device(device).type == "cuda":
        device_policy.exact_math()
        return 1e-5
    return 1e-6


def make_optimizer(params, lr: float):
    """SGD with momentum: a weight difference then shows the arithmetic of the split. (Adam
    divides by sqrt(v): a gradient of 1e-9 against 1e-9 + rounding moves a weight by up to lr.)"""
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def train_reference(cfg: dict, seed: int, data, lr: float, device="cpu") -> tuple[dict, list[float]]:
    """(name -> weight after the steps, loss of every step) for one process on the whole batch."""
    model = workload.build_model(cfg, seed, device)
    opt = make_optimizer(model.parameters(), lr)
    losses = []
    for x, y in data:
        x, y = x.to(device), y.to(device)
        loss = lm_loss(model(x), y, n_valid(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses
