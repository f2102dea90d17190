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
    """Bytes copied per step to give ``n_devices - 1`` other devices the weights (counted on the
    copies one step makes), and the time."""
    if torch.cuda.device_count() >= n_devices:  # the real thing
        from torch.nn.parallel import replicate
        devices = list(range(n_devices))
        model = model.to("cuda:0")
        ms = _median_ms(lambda: (replicate(model, devices), _sync()), repeats)
        # a replica's weights are plain tensors (no longer parameters), listed for DDP per module
        copies = [t for r in replicate(model, devices)[1:] for m in r.modules()
                  for t in (*m._former_parameters.values(), *m._buffers.values()) if t is not None]
        how = f"torch.nn.parallel.replicate to {n_devices} GPUs"
    else:
        params = [p.detach() for p in model.parameters()] + [b for b in model.buffers()]
        ms = _median_ms(lambda: [[t.clone() for t in params] for _ in range(n_devices - 1)], repeats)
        copies = [t.clone() for _ in range(n_devices - 1) for t in params]
        how = f"clones of every weight for {n_devices - 1} other device(s) (no GPUs here)"
    nbytes = sum(t.numel() * t.element_size() for t in copies)
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


# a step that does the same work costs the same CPU time within this factor; twice the work is outside
SAME_WORK = 1.5


def interleaved_steps(variants: dict, model, x, y, rounds: int = 10) -> dict:
    """Forward + loss + backward of every variant ({name: forward function}) in each of ``rounds``
    rounds (after a warm-up round), the variants back to back and their order rotated by one from
    round to round, so that no variant always runs first or right after the same one. Each step
    keeps its wall time and its CPU time (``time.process_time``: every thread of this process):
    a neighbour on the same cores lengthens the wall time, not the seconds this process computed.

    Returns {"wall_s": {name: [per round]}, "cpu_s": {name: [per round]}, "fastest_ms": {name: the
    least disturbed wall step}, "cpu_ratio": {name: paired_ratio of its CPU times to the first
    variant's}}."""
    names = list(variants)
    wall, cpu = {n: [] for n in names}, {n: [] for n in names}
    for r in range(rounds + 1):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            model.zero_grad(set_to_none=True)
            _sync()
            w0, c0 = time.perf_counter(), time.process_time()
            F.cross_entropy(variants[name](x), y).backward()
            _sync()
            w, c = time.perf_counter() - w0, time.process_time() - c0
            if r:  # round 0 is the warm-up
                wall[name].append(w)
                cpu[name].append(c)
    base = names[0]
    return {"wall_s": wall, "cpu_s": cpu,
            "fastest_ms": {n: 1e3 * min(ts) for n, ts in wall.items()},
            "cpu_ratio": {n: paired_ratio(ts, cpu[base]) for n, ts in cpu.items()}}


def paired_ratio(times, base) -> float:
    """Median over the rounds of ``times[i] / base[i]``, the two measured in the same round: a
    change of the machine's load between rounds slows both sides of a ratio, and one disturbed
    step moves the median by one place at most."""
    return statistics.median(t / b for t, b in zip(times, base, strict=True))


def same_work(times, base, margin: float = SAME_WORK) -> bool:
    """Whether two variants' steps cost the same (CPU) time within ``margin``, from paired_ratio."""
    return 1 / margin < paired_ratio(times, base) < margin


def small_ops(units: int) -> float:
    """Interpreter-bound work: many tiny tensor operations, like a deep model of small layers.
    Each operation lets go of the GIL while its kernel runs and takes it back after, so two
    threads of it hand the lock back and forth twice an operation."""
    torch.set_num_threads(1)
    a, b = torch.ones(8, 8), torch.full((8, 8), 0.5)
    for _ in range(units):
        a = torch.tanh(a @ b)
    return float(a.sum())


def python_ops(units: int) -> float:
    """Work for the interpreter alone, about as long as small_ops(units): the GIL is held
    throughout, except where the interpreter itself hands it to another thread."""
    total = 0
    for i in range(25 * units):
        total += i * i % 7
    return float(total)


def _in_process(work, units: int, queue, start) -> None:
    """``work`` in a worker process, once every worker is up (``start``, a barrier); reports when
    it started and ended (perf_counter is one clock for every process of the machine) and the CPU
    seconds it took."""
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    work(units)
    queue.put((t0, time.perf_counter(), time.process_time() - c0))


def gil_cost(units: int = 20000, workers: int = 2, rounds: int = 5, work=small_ops) -> dict:
    """Seconds for ``workers`` x ``units`` of ``work``: one after another, in threads, in
    processes; the three back to back in each of ``rounds`` rounds. Times are medians over the
    rounds; each speedup is the median over the rounds of that round's serial time over its
    threaded (or multi-process) time, so a busy spell of the machine slows both sides of it.
    With ``python_ops`` one thread runs at a time and the other sleeps until it gets the lock,
    so ``threads_cpu_per_wall`` (CPU time of the process over the threaded wall time) is about 1
    (2 if they ran in parallel on 2 free cores), and other programs on the cores only lower it
    (it counts every thread of this process: a kernel's own threads add a little);
    ``processes_cpu_per_wall`` is the same for the processes' work, started together: near 2
    where two cores were free for them, which says whether the round could show the contrast;
    the wall-time speedup of rounds this short moves with the load (a serial round that lost the
    core to another program gave 2.0 once in a loaded suite). With
    ``small_ops`` both threads are often runnable at once (one holds the lock, the other runs
    a kernel without it): their hand-offs cost more than they overlap on free cores, and on a
    busy machine, whose scheduler shares the cores by thread, they get more of it than one
    thread, so their speedup depends on the load."""
    work(1000)  # warm-up
    ctx = mp.get_context("fork")
    serial, threaded, threaded_cpu, processes, processes_cpu = [], [], [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(workers):
            work(units)
        serial.append(time.perf_counter() - t0)

        threads = [threading.Thread(target=work, args=(units,)) for _ in range(workers)]
        t0, c0 = time.perf_counter(), time.process_time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        threaded.append(time.perf_counter() - t0)
        threaded_cpu.append(time.process_time() - c0)   # every thread of this process

        queue, start = ctx.Queue(), ctx.Barrier(workers)
        procs = [ctx.Process(target=_in_process, args=(work, units, queue, start)) for _ in range(workers)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        done = [queue.get(timeout=120) for _ in procs]
        processes.append(time.perf_counter() - t0)
        for p in procs:
            p.join()
        # the work's own CPU over the span from the first start to the last end (start-up left out)
        processes_cpu.append(sum(c for *_, c in done) / (max(e for _, e, _ in done) - min(b for b, _, _ in done)))
    med = statistics.median
    return {"workers": workers, "rounds": rounds, "serial_s": med(serial), "threads_s": med(threaded),
            "processes_s": med(processes),
            "threads_speedup": med(s / t for s, t in zip(serial, threaded)),
            # cores the threads kept busy at once: 2 if they ran in parallel, about 1 if one ran at a
            # time; a busy machine only lowers it (time off the cores adds to the wall time alone)
            "threads_cpu_per_wall": med(c / t for c, t in zip(threaded_cpu, threaded)),
            "processes_speedup": med(s / p for s, p in zip(serial, processes)),
            # the same for the processes: about 2 where two cores were free for them in that round
            "processes_cpu_per_wall": med(processes_cpu)}


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
