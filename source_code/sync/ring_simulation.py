"""Parameter server and ring all-reduce, simulated in NumPy step by step (no processes).

Every step records each worker's buffers, which workers' gradients are already summed into
each chunk, and every transfer (sender, receiver, bytes), so that a notebook can draw the steps
and count the traffic from the simulation itself rather than from a formula.

    python -m source_code.sync.ring_simulation        # prints both simulations for N=4
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from source_code.figures import export

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of ``parts`` chunks covering ``n`` elements; sizes differ by at most one
    (the first ``n % parts`` chunks are one longer), like numpy.array_split and torch.tensor_split."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass
class Transfer:
    src: int
    dst: int
    what: str      # "chunk 2", "gradient", "weights"
    nbytes: int


@dataclass
class Step:
    phase: str                 # start | reduce-scatter | all-gather | push | aggregate | update | pull
    index: int                 # 1, 2, ... within the phase (0 for start)
    transfers: list
    buffers: list              # buffers[node][chunk] -> np.ndarray (a copy)
    contrib: list = field(default_factory=list)  # contrib[worker][chunk] -> frozenset of workers


@dataclass
class Simulation:
    kind: str                  # "ring" or "parameter server"
    n_workers: int
    node_names: list
    steps: list
    result: list               # per worker: the vector it holds at the end
    total: np.ndarray | None = None  # parameter server only: the summed gradient on the server

    def sent(self) -> np.ndarray:
        """Bytes each node sent, summed over all steps."""
        out = np.zeros(len(self.node_names), dtype=np.int64)
        for st in self.steps:
            for t in st.transfers:
                out[t.src] += t.nbytes
        return out

    def received(self) -> np.ndarray:
        out = np.zeros(len(self.node_names), dtype=np.int64)
        for st in self.steps:
            for t in st.transfers:
                out[t.dst] += t.nbytes
        return out

    def counted(self) -> dict:
        """The same keys as ``costmodel.traffic`` (without ``messages``), counted from the
        transfers: a non-root rank's bytes (the largest, rank 1 ... N-1) and the busiest link's."""
        sent, received = self.sent(), self.received()
        return {"rank_sent": int(sent[1:].max()), "rank_received": int(received[1:].max()),
                "link_in": int(received.max()), "link_out": int(sent.max())}


def _snapshot(buf):
    return [[c.copy() for c in row] for row in buf]


def simulate_ring(grads, itemsize: int = 4) -> Simulation:
    """Ring all-reduce (sum) of ``grads`` (one 1-D array per worker): reduce-scatter, then all-gather.

    Worker w sends to w+1 and receives from w-1. In reduce-scatter step s (0-based) it sends
    chunk (w - s) mod N and adds the incoming chunk (w - s - 1) mod N to its own; after N-1 steps
    it holds the complete sum of chunk (w + 1) mod N. In all-gather step s it forwards chunk
    (w + 1 - s) mod N, and the receiver overwrites its copy.
    """
    n = len(grads)
    size = len(grads[0])
    bounds = chunk_bounds(size, n)
    buf = [[np.asarray(g, dtype=np.float64)[a:b].copy() for a, b in bounds] for g in grads]
    contrib = [[frozenset({w}) for _ in range(n)] for w in range(n)]
    steps = [Step("start", 0, [], _snapshot(buf), [row[:] for row in contrib])]
    for s in range(n - 1):
        moves = [(w, (w + 1) % n, (w - s) % n) for w in range(n)]
        sent = [(dst, c, buf[w][c].copy(), contrib[w][c]) for w, dst, c in moves]  # all at once
        for dst, c, data, who in sent:
            buf[dst][c] += data
            contrib[dst][c] = contrib[dst][c] | who
        transfers = [Transfer(w, dst, f"chunk {c}", buf[w][c].size * itemsize) for w, dst, c in moves]
        steps.append(Step("reduce-scatter", s + 1, transfers, _snapshot(buf), [r[:] for r in contrib]))
    for s in range(n - 1):
        moves = [(w, (w + 1) % n, (w + 1 - s) % n) for w in range(n)]
        sent = [(dst, c, buf[w][c].copy(), contrib[w][c]) for w, dst, c in moves]
        for dst, c, data, who in sent:
            buf[dst][c] = data
            contrib[dst][c] = who
        transfers = [Transfer(w, dst, f"chunk {c}", buf[w][c].size * itemsize) for w, dst, c in moves]
        steps.append(Step("all-gather", s + 1, transfers, _snapshot(buf), [r[:] for r in contrib]))
    result = [np.concatenate(row) for row in buf]
    return Simulation("ring", n, [f"W{w}" for w in range(n)], steps, result)


def simulate_parameter_server(grads, weights, lr: float = 0.1, itemsize: int = 4) -> Simulation:
    """One parameter-server round over N ranks, rank 0 the server: push, aggregate, update, pull.

    As in ``comms.ps_all_reduce``, the server holds a gradient of its own too: ranks 1..N-1 push
    theirs to it, it sums all N (``sim.total``), applies one SGD step with the mean, and ranks
    1..N-1 pull the new weights (``result``: the weights every rank holds at the end)."""
    n = len(grads)
    g = [np.asarray(x, dtype=np.float64) for x in grads]
    w = np.asarray(weights, dtype=np.float64).copy()
    nb = g[0].size * itemsize
    names = ["W0\nserver"] + [f"W{i}" for i in range(1, n)]
    steps = [Step("start", 0, [], [[x.copy()] for x in g])]
    steps.append(Step("push", 1, [Transfer(i, 0, "gradient", nb) for i in range(1, n)],
                      [[x.copy()] for x in g]))
    total = np.sum(g, axis=0)
    steps.append(Step("aggregate", 1, [], [[total.copy()]] + [[x.copy()] for x in g[1:]]))
    w = w - lr * total / n
    steps.append(Step("update", 1, [], [[w.copy()]] + [[x.copy()] for x in g[1:]]))
    pulled = [w.copy() for _ in range(n)]
    steps.append(Step("pull", 1, [Transfer(0, i, "weights", nb) for i in range(1, n)], [[p] for p in pulled]))
    return Simulation("parameter server", n, names, steps, pulled, total)


# --------------------------------------------------------------------------- drawings
def draw_ring(sim: Simulation, path=None):
    """One panel per step: rows = workers, columns = chunks; a cell shows whose gradients it sums
    (A = worker 0, B = worker 1, ...), its colour how many; arrows show the step's transfers."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch
    n = sim.n_workers
    fig, axes = plt.subplots(1, len(sim.steps), figsize=(2.3 * len(sim.steps), 2.6), squeeze=False)
    cmap = plt.get_cmap("Blues")
    for ax, st in zip(axes[0], sim.steps):
        counts = np.array([[len(st.contrib[w][c]) for c in range(n)] for w in range(n)])
        ax.imshow(counts, cmap=cmap, vmin=0, vmax=n + 1)
        for w in range(n):
            for c in range(n):
                label = "".join(LETTERS[i] for i in sorted(st.contrib[w][c]))
                done = len(st.contrib[w][c]) == n
                ax.text(c, w, label, ha="center", va="center", fontsize=8,
                        color="white" if done else "black", fontweight="bold" if done else None)
        for t in st.transfers:
            c = int(t.what.split()[1])
            rad = 0.0 if t.dst > t.src else 0.6
            ax.add_patch(FancyArrowPatch((c + 0.3, t.src + 0.2), (c + 0.3, t.dst - 0.2)
                                         if t.dst > t.src else (c + 0.3, t.dst + 0.2),
                                         connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
                                         mutation_scale=9, color="tab:red", lw=1.2))
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"W{w}" for w in range(n)], fontsize=7)
        ax.set_title("start" if st.phase == "start" else f"{st.phase}\nstep {st.index}", fontsize=8)
    fig.suptitle(f"ring all-reduce, N={n}: reduce-scatter then all-gather "
                 "(letters = whose gradients are summed in the chunk)", fontsize=9)
    fig.tight_layout()
    export(fig, path)  # images/ only when exporting on purpose (source_code/figures.py)
    return fig


def draw_parameter_server(sim: Simulation, path=None):
    """One panel per phase of a parameter-server round: the server (rank 0) above, the others below."""
    import matplotlib.pyplot as plt
    n = sim.n_workers
    xs = np.linspace(0, 1, n - 1) if n > 2 else [0.5]
    pos = {i: (xs[i - 1], 0.0) for i in range(1, n)}
    pos[0] = (0.5, 1.0)
    steps = sim.steps[1:]
    fig, axes = plt.subplots(1, len(steps), figsize=(2.6 * len(steps), 2.4))
    for ax, st in zip(axes, steps):
        for t in st.transfers:
            (x0, y0), (x1, y1) = pos[t.src], pos[t.dst]
            ax.annotate("", (x1, y1 + (0.12 if y1 < y0 else -0.12)), (x0, y0 + (0.12 if y0 < y1 else -0.12)),
                        arrowprops=dict(arrowstyle="-|>", color="tab:red", lw=1.2))
        for node, (x, y) in pos.items():
            busy = st.phase in ("aggregate", "update") and node == 0
            ax.scatter([x], [y], s=900, color="tab:orange" if node == 0 else "tab:blue",
                       edgecolor="black" if busy else "none", linewidth=2)
            ax.text(x, y, sim.node_names[node], ha="center", va="center", color="white", fontsize=8)
        nbytes = sum(t.nbytes for t in st.transfers)
        where = "into" if st.phase == "push" else "out of"
        ax.set_title(st.phase + (f"\n{nbytes} B {where} the server" if nbytes else "\n(on the server)"), fontsize=8)
        ax.set_xlim(-0.2, 1.2)
        ax.set_ylim(-0.3, 1.3)
        ax.axis("off")
    fig.suptitle(f"parameter server, N={n} ranks: every byte goes through the server's link", fontsize=9)
    fig.tight_layout()
    export(fig, path)  # images/ only when exporting on purpose (source_code/figures.py)
    return fig


def traffic(ns, nbytes: int, itemsize: int = 4) -> list[dict]:
    """Counted bytes of the ring and the parameter server for each N: {"n", "ring": counted,
    "parameter_server": counted} (compare with ``costmodel.traffic``)."""
    rows = []
    rng = np.random.default_rng(0)
    for n in ns:
        grads = [rng.standard_normal(nbytes // itemsize) for _ in range(n)]
        ring = simulate_ring(grads, itemsize)
        ps = simulate_parameter_server(grads, np.zeros(nbytes // itemsize), itemsize=itemsize)
        rows.append({"n": n, "ring": ring.counted(), "parameter_server": ps.counted()})
    return rows


def plot_traffic(rows, nbytes: int, path=None):
    """Counted bytes per rank and through the busiest link (each direction), in units of M."""
    import matplotlib.pyplot as plt
    ns = [r["n"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, key, title in ((axes[0], "rank_sent", "bytes a (non-server) rank sends"),
                           (axes[1], "link_in", "bytes into the busiest link (= out)")):
        ax.plot(ns, [r["parameter_server"][key] / nbytes for r in rows], "o-", label="parameter server")
        ax.plot(ns, [r["ring"][key] / nbytes for r in rows], "s-", label="ring all-reduce")
        ax.set_xlabel("number of processes N")
        ax.set_ylabel("x buffer size M")
        ax.set_title(title + " (counted)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].legend()
    fig.tight_layout()
    export(fig, path)  # images/ only when exporting on purpose (source_code/figures.py)
    return fig


def main():
    rng = np.random.default_rng(0)
    grads = [rng.integers(0, 10, 10).astype(float) for _ in range(4)]
    ring = simulate_ring(grads)
    print("ring result equals the sum:", all(np.array_equal(r, np.sum(grads, axis=0)) for r in ring.result))
    print("ring bytes sent per worker:", ring.sent().tolist())
    ps = simulate_parameter_server(grads, np.zeros(10))
    print("parameter server bytes sent per rank (W0 = server, W1..W3):", ps.sent().tolist())


if __name__ == "__main__":
    main()
