"""Activation offloading: the tensors saved for backward kept in host memory (save_on_cpu).

    python -m source_code.memory.offload                  # CPU: bytes packed, gradients, time
    python -m source_code.memory.offload --device auto    # a GPU if the policy gives one: + peak memory

``torch.autograd.graph.save_on_cpu`` is a pair of saved-tensor hooks (the hooks saved.py counts
with): in forward every tensor an operation saves for backward is *packed*, copied to host
memory, and the device's copy can be freed once forward is past it; in backward each is
*unpacked*, copied back to the device, when its operation's backward needs it. With
``pin_memory=True`` the host copy is page-locked, so the copies can run asynchronously
(``non_blocking``) at the link's full rate; pinning needs a GPU, and on the CPU the hooks' own
rule skips it. On the CPU the tensors are already in host memory: ``tensor.cpu()`` returns the
same tensor and nothing moves (``copied`` counts what did).

It packs every saved tensor, parameters included (a linear layer saves its weight for the input
gradient): those bytes travel to the host and back although the model keeps them on the GPU
anyway (``packed_param_bytes``). Offloading pays when the activations a step keeps do not fit
next to the model and the transfers can hide behind the compute.
"""
from __future__ import annotations

import contextlib

import torch

from source_code import workload
from source_code.cli import Parser, positive_int
from source_code.distributed import pick_device
from source_code.measure import PeakRSS, clock
from source_code.memory import formula
from source_code.memory.saved import saved_bytes

# Assumptions for the GPU arithmetic (not measured here): an H100 sustaining about 40 % of its
# 989 dense bf16 TFLOP/s, and a PCIe Gen5 x16 host link moving about 50 GB/s each way with
# pinned memory (64 GB/s nominal).
GPU_TFLOPS, HOST_GBPS = 400.0, 50.0


def step(model, x, y, offload=None) -> torch.Tensor:
    """Forward and backward; inside ``offload`` (a save_on_cpu) the saved tensors go to the host."""
    with offload or contextlib.nullcontext():
        loss = workload.loss_fn(model, x, y)
    loss.backward()                         # each saved tensor unpacked when its backward runs
    return loss


class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """save_on_cpu whose pack hook also counts: bytes packed (distinct storages), of those the
    parameters', and the bytes that were really copied (the packed tensor has new storage)."""

    def __init__(self, pin_memory: bool, params=(), device_type: str = "cuda"):
        super().__init__(pin_memory=pin_memory, device_type=device_type)
        offload_pack, self._params = self.pack_hook, {p.untyped_storage().data_ptr() for p in params}
        self.packed = self.packed_params = self.copied = 0
        seen = set()

        def pack(t):
            packed = offload_pack(t)                     # (device, host tensor)
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                n = t.untyped_storage().nbytes()
                self.packed += n
                self.packed_params += n if key in self._params else 0
                self.copied += n if packed[1].untyped_storage().data_ptr() != key else 0
            return packed
        self.pack_hook = pack


def measure(cfg: dict | None = None, batch: int = 16, device="cpu", repeats: int = 5, seed: int = 0) -> dict:
    """One step plain and one under save_on_cpu on the same model and batch:
    {"activation_bytes" (saved.py's count, parameters excluded), "packed", "packed_params",
    "copied", "pin_memory", "max_abs_grad_diff", "seconds_plain", "seconds_offload",
    "time_ratio" (median of interleaved pairs), and on a GPU "peak_plain", "peak_offload"}."""
    device = torch.device(device)
    model = workload.build_model(cfg or workload.model_config(), seed, device)
    params = list(model.parameters())
    x, y = (t.to(device) for t in workload.global_batch(workload.sort_task(512), 0, batch, seed))
    pin = device.type == "cuda"                          # pinned host memory only with a GPU
    out = {"pin_memory": pin,
           "activation_bytes": saved_bytes(lambda: workload.loss_fn(model, x, y), params)}
    grads = {}
    for name in ("plain", "offload"):
        model.zero_grad(set_to_none=True)
        hooks = CountingSaveOnCpu(pin, params, device_type="cuda") if name == "offload" else None
        with PeakRSS(device) as peak:
            step(model, x, y, hooks)
        out[f"peak_{name}"] = peak.peak_bytes if device.type == "cuda" else None
        grads[name] = [p.grad.clone() for p in params]
        if hooks is not None:
            out.update(packed=hooks.packed, packed_params=hooks.packed_params, copied=hooks.copied)
    out["max_abs_grad_diff"] = max((a - b).abs().max().item() for a, b in zip(grads["plain"], grads["offload"]))
    times = {"plain": [], "offload": []}
    for _ in range(repeats):                             # interleaved: the load changes alike
        for name in times:
            model.zero_grad(set_to_none=True)
            start = clock(device)
            step(model, x, y, torch.autograd.graph.save_on_cpu(pin_memory=pin) if name == "offload" else None)
            times[name].append(clock(device) - start)
    ratios = sorted(o / p for o, p in zip(times["offload"], times["plain"]))
    out.update(seconds_plain=min(times["plain"]), seconds_offload=min(times["offload"]),
               time_ratio=ratios[len(ratios) // 2])
    return out


def copy_over_compute(hidden: int, heads: int, seq: int, tflops: float = GPU_TFLOPS,
                      host_gbps: float = HOST_GBPS) -> float:
    """Time to copy one block's saved bytes (bf16, formula.py's count) to the host over the
    block's forward time, per token: below 1 the copy can hide behind the forward. Forward FLOPs
    a token: 2 x 12 h^2 for the q, k, v, o and MLP matmuls, 4 s h for the scores and their use
    of v (no causal halving). The bytes grow as h, the FLOPs as h^2: wider models hide it."""
    copy_s = formula.block_bytes_per_token(hidden, heads, mode="bf16", device="cuda") / (host_gbps * 1e9)
    forward_s = (24 * hidden ** 2 + 4 * seq * hidden) / (tflops * 1e12)
    return copy_s / forward_s


def hides_from(heads_per_128: int = 1, seq: int = 4096, **rates) -> int:
    """The smallest hidden size (a multiple of 128, heads of 128 values) whose copy hides."""
    h = 128
    while copy_over_compute(h, max(1, h // 128 * heads_per_128), seq, **rates) > 1:
        h += 128
    return h


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "auto"), default="cpu",
                   help="auto: the device policy's choice (one GPU if there is one)")
    p.add_argument("--dim", type=positive_int, default=64)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--repeats", type=positive_int, default=5, help="timed steps per way")
    args = p.parse_args(argv)
    if args.dim % args.heads:
        p.error(f"--dim {args.dim} is not divisible by --heads {args.heads}; choose a multiple of the heads")
    device = pick_device()[0] if args.device == "auto" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(min(torch.get_num_threads(), 2))
    cfg = workload.model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads)
    r = measure(cfg, args.batch, device, args.repeats)
    peaks = (f" peak_plain_mib={r['peak_plain'] / 2**20:.2f} peak_offload_mib={r['peak_offload'] / 2**20:.2f}"
             if device.type == "cuda" else "")
    print(f"summary: device={device} pin_memory={r['pin_memory']} activation_bytes={r['activation_bytes']} "
          f"packed_bytes={r['packed']} packed_param_bytes={r['packed_params']} copied_bytes={r['copied']} "
          f"max_abs_grad_diff={r['max_abs_grad_diff']:.1e} time_ratio={r['time_ratio']:.2f}{peaks}")
    # bitwise on a CPU; on a GPU within rounding (3e-8 on an H200): the GPU's kernels need not
    # add in the same order in the offloaded step as in the plain one
    tolerance = 0.0 if device.type == "cpu" else 1e-6
    return 0 if r["max_abs_grad_diff"] <= tolerance else 1


if __name__ == "__main__":
    from source_code.errors import run_main
    run_main(main)
