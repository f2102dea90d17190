"""What nn.DataParallel pays in every step, measured one cost at a time (notebook 04).

    python -m source_code.training.dataparallel_costs            # the three costs, a line each

1. **replicate**: the weights are copied from the first device to every other one in every
   forward pass (``torch.nn.parallel.replicate`` on GPUs; on a CPU the same bytes are cloned,
   which is what the copy costs at the memory's speed);
2. **gather**: every device's outputs are copied to the first device and concatenated;
3. **one process**: a single Python interpreter drives all devices, one thread each; work that
   needs the interpreter (launching many small kernels, Python code between them) runs one
   thread at a time under the global interpreter lock (GIL). Measured with the same amount of
   small-operation work run one after the other, in threads, and in processes.
"""
from __future__ import annotations

import multiprocessing as mp
import statistics
import threading
import time

import torch
import torch.nn.functional as F

from source_code.cli import Parser, positive_int
from source_code.errors import run_main


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: first calls allocate
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def replicate_cost(model, n_devices: int, repeats: int = 20) -> dict:
    """Bytes copied per step to give ``n_devices - 1`` other devices the weights, and the time."""
    params = [p.detach() for p in model.parameters()] + [b for b in model.buffers()]
    nbytes = sum(t.numel() * t.element_size() for t in params) * (n_devices - 1)
    if torch.cuda.device_count() >= n_devices:  # the real thing
        from torch.nn.parallel import replicate
        devices = list(range(n_devices))
        model = model.to("cuda:0")
        ms = _median_ms(lambda: (replicate(model, devices), _sync()), repeats)
        how = f"torch.nn.parallel.replicate to {n_devices} GPUs"
    else:
        ms = _median_ms(lambda: [[t.clone() for t in params] for _ in range(n_devices - 1)], repeats)
        how = f"clones of every weight for {n_devices - 1} other device(s) (no GPUs here)"
    return {"bytes": nbytes, "ms": ms, "how": how}


def gather_cost(model, x, n_devices: int, repeats: int = 20) -> dict:
    """Bytes of the outputs that travel to the first device per step, and the time to gather them."""
    with torch.no_grad():
        outs = [model(chunk) for chunk in x.chunk(n_devices)]
    nbytes = sum(o.numel() * o.element_size() for o in outs[1:])  # the first device keeps its own
    if torch.cuda.device_count() >= n_devices:
        from torch.nn.parallel import gather
        outs = [o.to(f"cuda:{i}") for i, o in enumerate(outs)]
        ms = _median_ms(lambda: (gather(outs, 0), _sync()), repeats)
    else:
        ms = _median_ms(lambda: torch.cat([o.clone() for o in outs]), repeats)
    return {"bytes": nbytes, "ms": ms}


def step_ms(model, x, y, repeats: int = 20) -> float:
    """Median forward + loss + backward of the plain module on the whole batch."""
    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        _sync()
    return _median_ms(step, repeats)


def interleaved_step_ms(variants: dict, model, x, y, rounds: int = 10) -> dict:
    """Median forward + backward per variant ({name: forward function}), measured round-robin
    so that every variant sees the same machine load."""
    return interleaved_steps(variants, model, x, y, rounds)["ms"]


def interleaved_steps(variants: dict, model, x, y, rounds: int = 10) -> dict:
    """{"ms": median step per variant, "ratio": median over the rounds of each variant's step
    over the first variant's step of the same round}: the variants run back to back in every
    round, so a busy spell of the machine slows a round's variants alike."""
    times = {name: [] for name in variants}
    for r in range(rounds + 1):
        for name, forward in variants.items():
            model.zero_grad(set_to_none=True)
            _sync()
            t0 = time.perf_counter()
            F.cross_entropy(forward(x), y).backward()
            _sync()
            if r:  # round 0 is the warm-up
                times[name].append(time.perf_counter() - t0)
    first = times[next(iter(variants))]
    return {"ms": {name: 1e3 * statistics.median(ts) for name, ts in times.items()},
            "ratio": {name: statistics.median(t / f for t, f in zip(ts, first)) for name, ts in times.items()}}


def small_ops(units: int) -> float:
    """Interpreter-bound work: many tiny tensor operations, like a deep model of small layers."""
    torch.set_num_threads(1)
    a, b = torch.ones(8, 8), torch.full((8, 8), 0.5)
    for _ in range(units):
        a = torch.tanh(a @ b)
    return float(a.sum())


def _in_process(units: int, queue) -> None:
    queue.put(small_ops(units))


def gil_cost(units: int = 20000, workers: int = 2, rounds: int = 5) -> dict:
    """Seconds for ``workers`` x ``units`` of small_ops: one after another, in threads, in
    processes; the three back to back in each of ``rounds`` rounds. Times are medians over the
    rounds; each speedup is the median over the rounds of that round's serial time over its
    threaded (or multi-process) time, so a busy spell of the machine slows both sides of it."""
    small_ops(1000)  # warm-up
    ctx = mp.get_context("fork")
    serial, threaded, processes = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(workers):
            small_ops(units)
        serial.append(time.perf_counter() - t0)

        threads = [threading.Thread(target=small_ops, args=(units,)) for _ in range(workers)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        threaded.append(time.perf_counter() - t0)

        queue = ctx.Queue()
        procs = [ctx.Process(target=_in_process, args=(units, queue)) for _ in range(workers)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        for _ in procs:
            queue.get(timeout=120)
        processes.append(time.perf_counter() - t0)
        for p in procs:
            p.join()
    med = statistics.median
    return {"workers": workers, "rounds": rounds, "serial_s": med(serial), "threads_s": med(threaded),
            "processes_s": med(processes),
            "threads_speedup": med(s / t for s, t in zip(serial, threaded)),
            "processes_speedup": med(s / p for s, p in zip(serial, processes))}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=positive_int, default=2, help="devices DataParallel would use")
    p.add_argument("--batch-size", type=positive_int, default=128)
    a = p.parse_args(argv)
    from source_code import data, models
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = models.SmallCNN()
    x, y = data.digits("train").tensors
    x, y = x[:a.batch_size], y[:a.batch_size]
    step = step_ms(model, x, y)
    rep, gat = replicate_cost(model, a.devices), gather_cost(model, x, a.devices)
    gil = gil_cost()
    print(f"step (forward + backward, one device): {step:.2f} ms")
    print(f"replicate: {rep['bytes'] / 2**20:.2f} MiB per step, {rep['ms']:.3f} ms ({rep['how']})")
    print(f"gather:    {gat['bytes'] / 2**10:.1f} KiB per step, {gat['ms']:.3f} ms")
    print(f"GIL: {gil['workers']} workers of small operations: threads {gil['threads_speedup']:.2f}x, "
          f"processes {gil['processes_speedup']:.2f}x faster than one after another")
    return 0


if __name__ == "__main__":
    run_main(main)
