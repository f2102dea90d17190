"""Adam's two moments kept in fp32, in bf16, or in 8 bits (block-wise absmax quantisation).

    python -m source_code.memory.optimizer_precision              # bytes per parameter, loss after the steps
    python -m source_code.memory.optimizer_precision --steps 300 --lr 3e-3

Adam keeps two numbers per parameter, exp_avg (m) and exp_avg_sq (v): in fp32 that is 8 of the
16 bytes a parameter of fp32 training, and 8 of the 12 optimizer bytes of bf16 mixed precision.
Keeping them in fewer bits:

* ``bf16``: 2 bytes each. bf16 keeps 8 bits of precision, so a change smaller than half its
  spacing (2^-8 of the value) rounds away: v * beta2 with beta2 = 0.999 is such a change, so v
  in bf16 stops decaying (the lost updates of precision.lost_updates, inside the optimizer);
* ``8bit``: 1 byte each, as bitsandbytes' 8-bit optimizers keep them (Dettmers et al. 2022,
  "8-bit Optimizers via Block-wise Quantization"): the flattened moment is cut into blocks of
  ``block`` values; each block keeps its largest magnitude (absmax, one fp32 number) and every
  value as the index (uint8) of the nearest of 256 fixed levels of value / absmax. The levels are
  *dynamic* (``dynamic_map``): a few bits say the power of ten, the rest a linear fraction, so
  small values keep their relative precision (v spans orders of magnitude inside one block; 256
  evenly spaced levels would round most of it to 0 and divide the step by eps). m uses signed
  levels, v (never negative) unsigned ones.

Each step loads the moments into fp32, updates them, computes the parameter's update from the
fp32 values, and stores them back in their format (bitsandbytes does this inside one kernel).
bitsandbytes leaves tensors under 4096 values in fp32; here every tensor is quantised, so the
bytes counted are those of the format.
"""
from __future__ import annotations

import torch

from source_code import data, workload
from source_code.cli import Parser, positive_int
from source_code.measure import tensor_bytes

FORMATS = ("fp32", "bf16", "8bit")
BLOCK = 2048            # bitsandbytes' block size for its 8-bit optimizers


def dynamic_map(signed: bool = True) -> torch.Tensor:
    """The 256 sorted levels in [-1, 1] (signed) or [0, 1]: 0, 1, and for each power of ten
    10^-6 ... 10^0 a set of linear fractions in (0.1, 1] of it, more of them for larger powers."""
    levels = [0.0, 1.0]
    for i in range(7):
        n = 2 ** i if signed else 2 ** (i + 1)            # fraction values of this power of ten
        edges = torch.linspace(0.1, 1.0, n + 1, dtype=torch.float64)
        means = ((edges[:-1] + edges[1:]) / 2 * 10.0 ** (i - 6)).tolist()
        levels += means + ([-v for v in means] if signed else [])
    assert len(levels) == 256, len(levels)
    return torch.tensor(sorted(levels), dtype=torch.float32)


class Blockwise8bit:
    """A tensor kept as uint8 codes (one a value) and one fp32 absmax per block of ``block``."""

    def __init__(self, like: torch.Tensor, signed: bool, block: int = BLOCK):
        self.shape, self.numel, self.block = like.shape, like.numel(), block
        self.levels = dynamic_map(signed).to(like.device)          # shared, 1 KiB for all tensors
        self.edges = (self.levels[1:] + self.levels[:-1]) / 2       # nearest level: between edges
        n_blocks = -(-self.numel // block)
        self.codes = torch.zeros(self.numel, dtype=torch.uint8, device=like.device)
        self.absmax = torch.zeros(n_blocks, dtype=torch.float32, device=like.device)
        self.codes.fill_(int(torch.searchsorted(self.edges, torch.tensor(0.0, device=like.device))))

    def _blocks(self, flat: torch.Tensor) -> torch.Tensor:
        pad = self.absmax.numel() * self.block - self.numel
        return torch.nn.functional.pad(flat, (0, pad)).view(-1, self.block)   # (n_blocks, block)

    def store(self, x: torch.Tensor) -> None:
        blocks = self._blocks(x.reshape(-1).float())
        self.absmax.copy_(blocks.abs().amax(dim=1))
        scaled = blocks / self.absmax.clamp_min(1e-30)[:, None]              # in [-1, 1]
        self.codes.copy_(torch.bucketize(scaled, self.edges).reshape(-1)[:self.numel].to(torch.uint8))

    def load(self) -> torch.Tensor:
        values = self._blocks(self.levels[self.codes.long()]) * self.absmax[:, None]
        return values.reshape(-1)[:self.numel].view(self.shape)

    def tensors(self) -> list:
        return [self.codes, self.absmax]


class Plain:
    """A tensor kept in ``dtype`` (fp32 or bf16); loaded into fp32, stored rounded to nearest."""

    def __init__(self, like: torch.Tensor, dtype: torch.dtype):
        self.value = torch.zeros_like(like, dtype=dtype)

    def store(self, x: torch.Tensor) -> None:
        self.value.copy_(x)

    def load(self) -> torch.Tensor:
        return self.value.float()

    def tensors(self) -> list:
        return [self.value]


def moment(like: torch.Tensor, fmt: str, signed: bool, block: int = BLOCK):
    if fmt == "8bit":
        return Blockwise8bit(like, signed, block)
    if fmt in ("fp32", "bf16"):
        return Plain(like, torch.float32 if fmt == "fp32" else torch.bfloat16)
    raise ValueError(f"unknown moment format {fmt!r}; choose one of {', '.join(FORMATS)}")


class Adam:
    """Adam (no weight decay, torch.optim.Adam's arithmetic) with its moments kept as ``fmt`` says."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 fmt: str = "fp32", block: int = BLOCK):
        self.params = list(params)
        self.lr, (self.b1, self.b2), self.eps, self.t = lr, betas, eps, 0
        self.m = [moment(p, fmt, signed=True, block=block) for p in self.params]
        self.v = [moment(p, fmt, signed=False, block=block) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t            # bias corrections
        for p, m_kept, v_kept in zip(self.params, self.m, self.v):
            g = p.grad.float()
            m = m_kept.load().mul_(self.b1).add_(g, alpha=1 - self.b1)   # fp32 arithmetic
            v = v_kept.load().mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            m_kept.store(m)                                              # kept in its format
            v_kept.store(v)
            p.sub_((m / c1) / ((v / c2).sqrt() + self.eps) * self.lr)   # from the fp32 values

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list:
        return [t for kept in self.m + self.v for t in kept.tensors()]


def state_bytes_per_param(fmt: str, cfg: dict | None = None, block: int = BLOCK) -> float:
    """Bytes of Adam's two moments per parameter, counted from the tensors that keep them."""
    model = workload.build_model(cfg or workload.model_config(), 0)
    opt = Adam(model.parameters(), fmt=fmt, block=block)
    return tensor_bytes(opt.state_tensors()) / sum(p.numel() for p in opt.params)


def train(fmt: str, steps: int = 150, lr: float = 3e-3, batch_size: int = 16, cfg: dict | None = None,
          seed: int = 0, block: int = BLOCK) -> dict:
    """``steps`` Adam steps on the shared workload (TransformerLM, sort task), fp32 weights,
    moments in ``fmt``: {"losses": per step, "final": mean loss of the last 10 steps,
    "held_out": loss on a batch no step saw}."""
    torch.manual_seed(seed)
    model = workload.build_model(cfg or workload.model_config(), seed)
    opt = Adam(model.parameters(), lr=lr, fmt=fmt, block=block)
    task = workload.sort_task(2048)
    losses = []
    for step in range(steps):
        x, y = workload.global_batch(task, step, batch_size, seed)
        loss = workload.loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    x, y = workload.global_batch(data.sequence_task("sort", n=256, seed=seed + 1), 0, 256)
    with torch.no_grad():
        held_out = workload.loss_fn(model, x, y).item()
    return {"losses": losses, "final": sum(losses[-10:]) / 10, "held_out": held_out}


def compare(steps: int = 150, lr: float = 3e-3, formats=FORMATS, block: int = BLOCK) -> dict:
    """{fmt: {"bytes_per_param", "final", "held_out", "losses"}}: the same steps, same data."""
    out = {}
    for fmt in formats:
        out[fmt] = {"bytes_per_param": state_bytes_per_param(fmt, block=block),
                    **train(fmt, steps, lr, block=block)}
    return out


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=150, help="Adam steps per format")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--block", type=positive_int, default=BLOCK, help="values per absmax block (8bit)")
    args = p.parse_args(argv)
    if not 0 < args.lr < 1:
        p.error(f"--lr {args.lr}: give a learning rate between 0 and 1, e.g. 3e-3")
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    runs = compare(args.steps, args.lr, block=args.block)
    for fmt, r in runs.items():
        print(f"moments_{fmt}: bytes_per_param={r['bytes_per_param']:.3f} final_loss={r['final']:.4f} "
              f"held_out_loss={r['held_out']:.4f}", flush=True)
    print("summary: " + " ".join(f"{f}_held_out_loss={r['held_out']:.4f}" for f, r in runs.items()))
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main
    run_main(main)
