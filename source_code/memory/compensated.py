"""Pure bf16 weights that keep their small updates: Kahan compensation and stochastic rounding.

    python -m source_code.memory.compensated        # the small-update experiment, one line per way

precision.lost_updates shows the problem: a weight near 1 kept in bf16 (spacing 2^-7 there)
does not move when a step adds 1e-4, however many steps add it. An fp32 master copy fixes it
at 4 more bytes a parameter. Two fixes that keep the weights in bf16:

* **Kahan-compensated summation** (AnyPrecisionAdamW in torchdistx; the bf16 optimizers of
  several LLM trainers): a second bf16 tensor ``comp`` keeps what rounding the weight lost; the
  next update adds it back before rounding again. 2 bytes a parameter for the compensation;
* **stochastic rounding** (Gupta et al. 2015; Zamirai et al. 2020 for bf16): round the fp32
  result up or down at random, up with the probability of the distance to the lower
  neighbour, so the rounding is right on average: 100 steps of 1e-4 move a weight by 0.01 in
  expectation. Adding 16 random bits to the fp32 bit pattern and cutting the low 16 bits off
  does it. No bytes kept (the random bits are drawn and dropped), some noise per weight.
"""
from __future__ import annotations

import torch

from source_code.cli import Parser, positive_int
from source_code.measure import tensor_bytes

WAYS = ("bf16", "kahan", "stochastic", "fp32-master")


def kahan_add_(w: torch.Tensor, comp: torch.Tensor, update: torch.Tensor) -> None:
    """w += update for a bf16 ``w``, what the rounding loses kept in the bf16 ``comp``."""
    y = update.float() + comp.float()            # the update plus what was lost before
    t = (w.float() + y).to(torch.bfloat16)       # the new weight, rounded to bf16
    comp.copy_(y - (t.float() - w.float()))      # what the rounding lost this time
    w.copy_(t)


def stochastic_round(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 -> bf16, rounding up with the probability of the distance to the lower neighbour."""
    bits = x.float().contiguous().view(torch.int32)                   # bf16 = the high 16 bits
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)   # low 16 bits cut


def small_updates(lr: float = 1e-4, steps: int = 100, n: int = 4096, seed: int = 0) -> dict:
    """precision.lost_updates' experiment (weights near 1, SGD on a constant gradient of 1:
    every step adds -lr), run four ways: {way: {"moved": fraction of weights that moved,
    "drift": (n,) fp32 tensor of how far each moved, "bytes_per_param": weight + what else the
    way keeps, counted}} plus "expected_drift" = lr * steps."""
    g = torch.Generator().manual_seed(seed)
    w0 = (1 + 0.1 * torch.rand(n, generator=g)).to(torch.bfloat16)    # as precision.lost_updates
    rounding = torch.Generator().manual_seed(seed + 1)
    pure, kahan, comp, sr, master = w0.clone(), w0.clone(), torch.zeros_like(w0), w0.clone(), w0.float()
    update = torch.full((n,), -lr)
    for _ in range(steps):
        pure += update                                        # rounds to nothing
        kahan_add_(kahan, comp, update)
        sr = stochastic_round(sr.float() + update, rounding)
        master += update                                      # the fp32 master copy
    kept = {"bf16": (pure, [pure]), "kahan": (kahan, [kahan, comp]), "stochastic": (sr, [sr]),
            "fp32-master": (master.to(torch.bfloat16), [master.to(torch.bfloat16), master])}
    out = {"expected_drift": lr * steps, "fp32_master_drift": w0.float() - master}
    for way, (w, tensors) in kept.items():
        out[way] = {"moved": (w != w0).float().mean().item(), "drift": w0.float() - w.float(),
                    "bytes_per_param": tensor_bytes(tensors) / n}
    out["kahan"]["drift_with_comp"] = w0.float() - (kahan.float() + comp.float())
    return out


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=100)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args(argv)
    if not 0 < args.lr < 1:
        p.error(f"--lr {args.lr}: give a step size between 0 and 1, e.g. 1e-4")
    r = small_updates(args.lr, args.steps)
    for way in WAYS:
        d = r[way]["drift"]
        print(f"{way}: moved={r[way]['moved']:.3f} mean_drift={d.mean():.3e} drift_std={d.std():.2e} "
              f"bytes_per_param={r[way]['bytes_per_param']:.0f}", flush=True)
    print(f"summary: expected_drift={r['expected_drift']:.3e} kahan_mean_drift={r['kahan']['drift'].mean():.3e} "
          f"stochastic_mean_drift={r['stochastic']['drift'].mean():.3e}")
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main
    run_main(main)
