"""Links as data, and the share of a training step an all-reduce takes on each.

The alpha-beta model of notebook 03 (``source_code.costmodel``): a ring all-reduce of M bytes
over n processes costs 2 (n-1) x alpha + 2 (n-1)/n x M / beta. Each link below is
(alpha in s, beta in bytes/s per direction, where the numbers come from):

    node        NVLink 4 of an H100 SXM: 900 GB/s per GPU for both directions together
                (NVIDIA H100 datasheet), so 450 GB/s each way; alpha 5 us, the order of a small
                all-reduce's latency in nccl-tests on one node
    cluster     InfiniBand NDR, 400 Gb/s a port = 50 GB/s (NVIDIA ConnectX-7 datasheet);
                alpha 5 us (the same order: software, not the wire, dominates)
    datacenter  100 Gb/s Ethernet = 12.5 GB/s; alpha 50 us (TCP through the kernel)
    inter-site  1 Gb/s = 125 MB/s, a common internet uplink between two sites (an assumption:
                leased lines are faster, shared ones slower); alpha 28 ms: light in fibre goes
                about 200,000 km/s, and New York - London is 5,570 km (one way, no routing)

``latency_link(seconds, world)`` is a link made from a time measured in the run (the checks
that sleep a link's time use it, so that their margins do not depend on the machine).
``compute_seconds(n_params, tokens, flops)`` is the 6 N T rule of thumb (a forward and a
backward pass: 6 floating-point operations per parameter and token) at a stated throughput.
"""
from __future__ import annotations

from dataclasses import dataclass

from source_code import costmodel


@dataclass(frozen=True)
class Link:
    name: str
    alpha: float    # s per message
    beta: float     # bytes/s, each direction
    source: str


LINKS = {
    "node": Link("node", 5e-6, 450e9, "NVLink 4 (H100 SXM datasheet: 900 GB/s both ways)"),
    "cluster": Link("cluster", 5e-6, 50e9, "InfiniBand NDR 400 Gb/s (ConnectX-7 datasheet)"),
    "datacenter": Link("datacenter", 50e-6, 12.5e9, "100 Gb/s Ethernet"),
    "inter-site": Link("inter-site", 0.028, 125e6,
                       "1 Gb/s uplink; 5,570 km of fibre at 200,000 km/s"),
}

# an H100's dense bf16 throughput (NVIDIA datasheet: 989 TFLOP/s) at 40 % model-flops
# utilisation, a typical figure for large-model training (an assumption, stated as one)
H100_BF16_FLOPS = 989e12
TYPICAL_MFU = 0.4


def latency_link(seconds: float, world: int, name: str = "measured") -> Link:
    """A link on which one ring all-reduce over ``world`` processes takes ``seconds``, whatever
    its size (unlimited bandwidth): a link set from a time measured in the same run, so that a
    check's delay scales with the machine that runs it."""
    if seconds <= 0 or world < 2:
        raise ValueError("need seconds > 0 and world >= 2")
    return Link(name, seconds / (2 * (world - 1)), float("inf"), "set from a measured step time")


def link(name: str) -> Link:
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r}; choose one of {', '.join(LINKS)}")
    return LINKS[name]


def collective_terms(kind: str, nbytes: float, world: int) -> tuple[float, float]:
    """(sequential messages, bytes each rank sends) of one collective: an all-reduce as a ring
    (notebook 03's model), all-gather, reduce-scatter and broadcast as one ring pass ((n-1)
    messages, (n-1)/n of the bytes)."""
    if kind == "all_reduce":
        t = costmodel.traffic("ring", world, nbytes)
        return t["messages"], t["link_out"]
    return world - 1, (world - 1) / world * nbytes


def collective_seconds(kind: str, nbytes: float, which: Link | str, world: int) -> float:
    """Time of one collective on the link: messages x alpha + bytes / beta."""
    lk = link(which) if isinstance(which, str) else which
    messages, sent = collective_terms(kind, nbytes, world)
    return messages * lk.alpha + sent / lk.beta


def allreduce_seconds(nbytes: float, which: Link | str, world: int) -> float:
    """Time of one ring all-reduce of ``nbytes`` over ``world`` processes on the link."""
    return collective_seconds("all_reduce", nbytes, which, world)


def compute_seconds(n_params: float, tokens: float, flops: float = H100_BF16_FLOPS * TYPICAL_MFU) -> float:
    """6 N T floating-point operations at ``flops`` per second."""
    return 6.0 * n_params * tokens / flops


def step_fraction(n_params: float, which: Link | str, world: int, compute_s: float,
                  bytes_per_param: int = 4) -> float:
    """Share of a step spent in the gradient all-reduce when it does not overlap compute:
    comm / (compute + comm), the gradients at ``bytes_per_param`` bytes each."""
    if compute_s < 0 or n_params <= 0 or world < 2:
        raise ValueError("need n_params > 0, world >= 2 and compute_s >= 0")
    comm = allreduce_seconds(n_params * bytes_per_param, which, world)
    return comm / (compute_s + comm)
