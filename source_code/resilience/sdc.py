"""Silent data corruption of one replica's state: compare a checksum across ranks, name the odd one.

    python -m source_code.resilience.sdc_drill --world-size 3 --fault state-once --rank 1 --at-step 5

In data parallelism every rank holds the same parameters after every step, bit for bit. A bit
flipped in one rank's memory (a cosmic ray, a failing HBM cell) raises no error: the loss
barely moves and training goes on, mixing the bad rank's gradients into everyone's. So:
* ``checksum(model)``: one 64-bit integer per rank from the bytes of its parameters;
* ``odd_ranks(model)``: all-gather the checksums; the value most ranks hold is the good one
  (three or more ranks: a majority exists), the others are named;
* ``state_verdict``: every rank restores the last state all agreed on (a copy kept every step:
  part of the check's cost) and computes the step again; if the same rank differs again, the
  fault repeats on that device while the others, computing the same update from the same
  state, agree: that device is at fault (persistent); if not, it was transient.

What this cannot see: corruption in the computation itself (a wrong forward or backward on
one rank) goes through the gradient all-reduce into *every* replica, and the checksums still
agree. rerun.py finds that kind.
"""
from __future__ import annotations

import hashlib
from collections import Counter

import torch
import torch.distributed as dist


def checksum(model) -> int:
    """A 64-bit digest of every parameter's bytes (equal iff the bytes are, but for 2^-64)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little", signed=True)


def gather_checksums(model, group=None) -> list[int]:
    mine = torch.tensor([checksum(model)], dtype=torch.int64)           # (1,) on the CPU: gloo
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)                            # world_size x 8 bytes
    return [int(t.item()) for t in every]


def odd_ranks(model, group=None) -> list[int]:
    """The ranks whose replicated state differs from the majority's ([] when all agree)."""
    sums = gather_checksums(model, group)
    if len(set(sums)) == 1:
        return []
    if len(sums) < 3:
        raise ValueError("two ranks disagree but a majority needs three or more ranks to say which "
                         "is wrong; run the check with --world-size 3 or more")
    good, _ = Counter(sums).most_common(1)[0]
    return [r for r, s in enumerate(sums) if s != good]


def flip_bit(tensor: torch.Tensor, index: int, bit: int) -> None:
    """Flip bit ``bit`` (0 = least significant) of element ``index`` of a float32 tensor, in place."""
    if tensor.dtype != torch.float32 or not 0 <= bit < 32:
        raise ValueError("flip_bit handles float32 tensors and bits 0..31")
    words = tensor.data.view(-1).view(torch.int32)
    words[index] ^= (1 << bit) if bit < 31 else -(1 << 31)


def state_verdict(odd: list[int], odd_again: list[int]) -> str:
    """What a replay of the step from the agreed state says about the ranks first named ``odd``."""
    if not odd_again:
        return "transient"                  # not reproduced: a one-off fault (drain if it recurs)
    if odd_again == odd:
        return "persistent"                 # the same device again, the others agree: that device
    return "inconsistent"                   # another rank this time: look at both


def restore(model, optimizer, state: dict) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
