"""SGD and data parallelism on a real problem: softmax regression on the embedded digits.

    python -m source_code.basics.sgd_theory             # the checks of notebook 01, in seconds

* ``train``: GD (batch = all data), SGD (batch 1) and mini-batch SGD with the same code, the
  full training loss recorded against epochs and against updates (gradient evaluations);
* ``shard_gradients`` / ``shard_identity``: the mean of N equal shards' gradients is the
  gradient of the whole batch (the fact data parallelism rests on), checked with autograd;
* ``spawn_averaged_gradient``: the same with real processes and all_reduce;
* ``global_batch_size`` and ``accumulation_gap``: global = per-device x world size x
  accumulation steps, and accumulating micro-batch gradients gives the big-batch gradient;
* ``warmup_lr`` and ``lr_scaling_runs``: linear warmup, and the linear scaling experiment
  (batch B with lr; batch kB with lr, k*lr, and k*lr after a warmup), judged by ``peak_loss``
  (did the loss overshoot above its start?) and the final loss.

Softmax regression (a linear layer + cross-entropy, weights start at zero) is convex and
small: every run is deterministic for a seed and takes a fraction of a second.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F

from source_code.cli import Parser, positive_int
from source_code.data import digits

N_FEATURES, N_CLASSES = 64, 10


# --------------------------------------------------------------------------- the problem
def digits_xy(split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """Digits as a (N, 64) float matrix in [0, 1] and (N,) int64 labels."""
    x, y = digits(split).tensors
    return x.flatten(1), y


def init_weights() -> torch.Tensor:
    """(65, 10): 64 rows of weights and one row of biases, all zero (loss = ln 10 at start)."""
    return torch.zeros(N_FEATURES + 1, N_CLASSES)


def loss_fn(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of softmax(x @ W + b) over the examples of the batch."""
    return F.cross_entropy(x @ w[:-1] + w[-1], y)


def gradient(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """d loss_fn / d w on this batch, by autograd (float64 inputs give float64 gradients)."""
    w = w.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(loss_fn(w, x, y), w)
    return g


# --------------------------------------------------------------------------- shards
def shard_gradients(w, x, y, n_shards: int, sizes: list[int] | None = None):
    """Split the batch into ``n_shards`` consecutive shards (equal, or of ``sizes``); return
    (list of per-shard gradients, list of shard sizes). Each shard's gradient is that of its
    own mean loss, as every rank of data parallelism computes it."""
    if sizes is None:
        if len(y) % n_shards:
            raise ValueError(f"batch of {len(y)} does not split into {n_shards} equal shards; "
                             "pass sizes=[...] or pick a divisible batch")
        sizes = [len(y) // n_shards] * n_shards
    if sum(sizes) != len(y) or len(sizes) != n_shards:
        raise ValueError(f"sizes {sizes} must be {n_shards} numbers adding up to {len(y)}")
    grads = [gradient(w, xs, ys) for xs, ys in zip(x.split(sizes), y.split(sizes))]
    return grads, list(sizes)


def problem_batch(batch: int = 256, seed: int = 0, dtype=torch.float64):
    """A fixed batch of digits and random (not zero) weights, so gradients are not trivial."""
    x, y = digits_xy("train")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(y), generator=g)[:batch]
    w = 0.1 * torch.randn(N_FEATURES + 1, N_CLASSES, generator=g, dtype=dtype)
    return w, x[idx].to(dtype), y[idx]


def shard_identity(n_shards: int, batch: int = 256, seed: int = 0) -> float:
    """max |mean of the N shard gradients - gradient of the whole batch| (float64)."""
    w, x, y = problem_batch(batch, seed)
    grads, _ = shard_gradients(w, x, y, n_shards)
    return (torch.stack(grads).mean(0) - gradient(w, x, y)).abs().max().item()


def spawn_averaged_gradient(batch: int = 256, seed: int = 0):
    """Run on every rank of a process group (processes.spawn): take this rank's contiguous
    shard of the same global batch, compute its gradient, all_reduce(SUM) / world size.
    Returns the averaged gradient as a NumPy array (identical on every rank)."""
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    w, x, y = problem_batch(batch, seed)
    if batch % world:
        raise ValueError(f"global batch {batch} must be divisible by the world size {world}")
    per_rank = batch // world
    lo = rank * per_rank
    g = gradient(w, x[lo:lo + per_rank], y[lo:lo + per_rank])
    dist.all_reduce(g, op=dist.ReduceOp.SUM)
    return (g / world).numpy()


def averaged_gradient_across_processes(world_size: int = 2, batch: int = 256, seed: int = 0) -> float:
    """Start ``world_size`` processes, all_reduce their shard gradients and return
    max |averaged gradient - single-process gradient of the whole batch| (over all ranks)."""
    from source_code.processes import spawn
    per_rank = spawn(spawn_averaged_gradient, world_size, batch, seed)
    w, x, y = problem_batch(batch, seed)
    ref = gradient(w, x, y)
    return max((torch.from_numpy(g) - ref).abs().max().item() for g in per_rank)


# --------------------------------------------------------------------------- batch sizes
def global_batch_size(per_device: int, world_size: int, accumulation_steps: int = 1) -> int:
    """Examples behind one optimizer step: per-device batch x world size x accumulation steps."""
    for name, v in (("per_device", per_device), ("world_size", world_size),
                    ("accumulation_steps", accumulation_steps)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return per_device * world_size * accumulation_steps


def accumulation_gap(per_device: int, world_size: int, accumulation_steps: int, seed: int = 0) -> float:
    """Simulate ``world_size`` ranks that each accumulate ``accumulation_steps`` micro-batches
    (loss / accumulation_steps, gradients summed) and then average over ranks; return
    max |result - gradient of the whole global batch|."""
    total = global_batch_size(per_device, world_size, accumulation_steps)
    w, x, y = problem_batch(total, seed)
    per_rank = []
    for r in range(world_size):
        acc = torch.zeros_like(w)
        for s in range(accumulation_steps):
            lo = (r * accumulation_steps + s) * per_device
            acc += gradient(w, x[lo:lo + per_device], y[lo:lo + per_device]) / accumulation_steps
        per_rank.append(acc)
    return (torch.stack(per_rank).mean(0) - gradient(w, x, y)).abs().max().item()


# --------------------------------------------------------------------------- schedules
def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Learning rate for update ``step`` (1, 2, ...): a linear ramp lr*step/warmup_steps up
    to ``lr``, then constant. warmup_steps = 0 means no warmup."""
    if step < 1:
        raise ValueError(f"steps count from 1, got {step}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if warmup_steps == 0:
        return lr
    return lr * min(1.0, step / warmup_steps)


# --------------------------------------------------------------------------- training
def train(batch_size: int, lr: float, epochs: int, warmup_steps: int = 0, seed: int = 0,
          evals_per_epoch: int = 20, split: str = "train") -> dict:
    """Plain SGD (no momentum) on softmax regression, batches drawn without replacement.

    batch_size = number of training examples gives GD, 1 gives SGD. The full training loss is
    recorded at the start, after each of the first 10 updates, ~``evals_per_epoch`` times per
    epoch and at the end of every epoch. Returns {"updates", "epochs", "loss", ...} lists.
    """
    with _threads(1):  # tiny ops: one thread is faster than several on a shared CPU
        return _train(batch_size, lr, epochs, warmup_steps, seed, evals_per_epoch, split)


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


def _train(batch_size, lr, epochs, warmup_steps, seed, evals_per_epoch, split):
    x, y = digits_xy(split)
    n = len(y)
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be between 1 and {n} (the training set), got {batch_size}")
    steps_per_epoch = n // batch_size  # the incomplete last batch is dropped
    stride = max(1, steps_per_epoch // evals_per_epoch)
    g = torch.Generator().manual_seed(seed)
    w = init_weights().requires_grad_(True)
    hist = {"updates": [0], "epochs": [0.0], "loss": [loss_fn(w, x, y).item()], "seconds": [0.0]}
    step, busy = 0, 0.0  # busy: seconds spent in updates (the evaluations below are not counted)
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(steps_per_epoch):
            t0 = time.perf_counter()
            idx = perm[i * batch_size:(i + 1) * batch_size]
            (grad,) = torch.autograd.grad(loss_fn(w, x[idx], y[idx]), w)
            step += 1
            with torch.no_grad():
                w -= warmup_lr(step, lr, warmup_steps) * grad
            busy += time.perf_counter() - t0
            if step <= 10 or (i + 1) % stride == 0 or i + 1 == steps_per_epoch:
                with torch.no_grad():
                    loss = loss_fn(w, x, y).item()
                if not math.isfinite(loss):
                    raise FloatingPointError(f"loss became {loss} at update {step} (lr {lr} too "
                                             f"large for batch {batch_size}); lower the lr")
                hist["updates"].append(step)
                hist["epochs"].append(step / steps_per_epoch)
                hist["loss"].append(loss)
                hist["seconds"].append(busy)
    hist.update(batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
                steps_per_epoch=steps_per_epoch, final_loss=hist["loss"][-1])
    return hist


def tune_lr(batch_size: int, epochs: int, lrs, seed: int = 0) -> dict:
    """Train at every learning rate of ``lrs``; return the run with the lowest final loss (runs
    that diverge are skipped), with ``tried`` = {lr: final loss or inf} added."""
    runs, tried = {}, {}
    for lr in lrs:
        try:
            runs[lr] = train(batch_size, lr, epochs, seed=seed)
            tried[lr] = runs[lr]["final_loss"]
        except FloatingPointError:
            tried[lr] = math.inf
    if not runs:
        raise ValueError(f"every learning rate in {list(lrs)} diverged for batch {batch_size}")
    best = min(runs, key=lambda lr: runs[lr]["final_loss"])
    return {**runs[best], "tried": tried}


def update_seconds(batch_sizes, rounds: int = 40, per_round: int = 5, seed: int = 0) -> dict:
    """{batch size: median seconds of one update}, the batch sizes taking turns ``rounds`` times
    (``per_round`` updates each): a busy spell of the machine falls on every batch size, and the
    median leaves it out. The same update as ``train``'s, on the training set."""
    x, y = digits_xy("train")
    g = torch.Generator().manual_seed(seed)
    w = init_weights().requires_grad_(True)
    times = {b: [] for b in batch_sizes}
    with _threads(1):
        for r in range(rounds + 1):  # round 0 warms up
            for b in batch_sizes:
                idx = torch.randperm(len(y), generator=g)[:b]
                t0 = time.perf_counter()
                for _ in range(per_round):
                    (grad,) = torch.autograd.grad(loss_fn(w, x[idx], y[idx]), w)
                    with torch.no_grad():
                        w -= 1e-3 * grad
                if r:
                    times[b].append((time.perf_counter() - t0) / per_round)
    return {b: statistics.median(ts) for b, ts in times.items()}


def on_clock(hist: dict, seconds_per_update: float) -> dict:
    """``hist`` with its time axis from its update count: update k at k x ``seconds_per_update``
    (a measured median), so that runs measured at different moments share one clock."""
    return {**hist, "seconds": [u * seconds_per_update for u in hist["updates"]]}


def loss_at_seconds(hist: dict, seconds: float) -> float:
    """The last recorded full training loss within ``seconds`` of update time."""
    return [l for s, l in zip(hist["seconds"], hist["loss"]) if s <= seconds][-1]


def lr_scaling_runs(base_batch: int = 16, base_lr: float = 0.4, k: int = 8, epochs: int = 6,
                    warmup_epochs: int = 2, seed: int = 0) -> dict:
    """The linear scaling experiment: batch B with lr, then batch kB with lr (unscaled),
    k*lr (scaled) and k*lr reached by a linear warmup over ``warmup_epochs`` epochs."""
    big = k * base_batch
    warm = warmup_epochs * (len(digits_xy()[1]) // big)
    return {
        f"B={base_batch}, lr={base_lr:g}": train(base_batch, base_lr, epochs, seed=seed),
        f"B={big}, lr={base_lr:g} (unscaled)": train(big, base_lr, epochs, seed=seed),
        f"B={big}, lr={k * base_lr:g} (scaled)": train(big, k * base_lr, epochs, seed=seed),
        f"B={big}, lr={k * base_lr:g} + warmup": train(big, k * base_lr, epochs, warm, seed=seed),
    }


def loss_at_update(hist: dict, update: int) -> float:
    """The recorded full training loss right after ``update`` updates."""
    return hist["loss"][hist["updates"].index(update)]


def peak_loss(hist: dict, first_epochs: float | None = None) -> float:
    """The highest recorded loss after the start (within the first ``first_epochs`` epochs,
    or over the whole run when None)."""
    limit = math.inf if first_epochs is None else first_epochs
    return max(l for e, l in zip(hist["epochs"], hist["loss"]) if 0 < e <= limit)


def main(argv=None):
    p = Parser(description="The checks of notebook 01 on softmax regression.")
    p.add_argument("--epochs", type=positive_int, default=3)
    args = p.parse_args(argv)
    for n in (1, 2, 4, 8):
        print(f"{n} shards: max |mean shard grad - batch grad| = {shard_identity(n):.2e}")
    print(f"2 ranks x 4 accumulation steps x 32: max gap {accumulation_gap(32, 2, 4):.2e}")
    for name, b, lr in (("GD", 1438, 2.0), ("SGD", 1, 0.05), ("mini-batch", 32, 0.5)):
        h = train(b, lr, args.epochs)
        print(f"{name:>10}: batch {b:>4}, lr {lr}: loss after {args.epochs} epochs "
              f"({h['updates'][-1]} updates) {h['final_loss']:.3f}")
    return 0


if __name__ == "__main__":
    from source_code.distributed import run_main
    run_main(main)
