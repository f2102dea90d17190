"""The collectives of ZeRO by hand, and the bookkeeping of who owns which chunk.

Every parameter tensor of n elements is flattened and cut into N equal chunks of
c = ceil(n / N) elements (the last chunks are padded with zeros); rank r owns chunk r:

    flat parameter  (n,)      |  chunk 0  |  chunk 1  | ... | chunk N-1 (+ padding) |
    padded          (N * c,)
    rank r's shard  (c,)      = padded[r * c : (r + 1) * c]

The three collectives (gloo on CPU tensors, NCCL on CUDA tensors; the same calls):

* all-reduce      every rank: full tensor in, full sum out          (DDP, ZeRO-1 gradients)
* reduce-scatter  every rank: full tensor in, its chunk of the sum   (ZeRO-2 gradients)
* all-gather      every rank: its chunk in, the full tensor out      (updated parameters)
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

# torch >= 2.13 marks the *_tensor collectives deprecated in favour of functional ones; they are
# still the plain, documented calls that work on torch 2.6 and on gloo, so say it once, not per step
warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).*",
                        category=FutureWarning)


def chunk_size(numel: int, world_size: int) -> int:
    """c = ceil(numel / world_size): the length of every rank's chunk (padding included)."""
    return -(-numel // world_size)


def owned_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of the *real* elements (no padding) of the flat tensor that ``rank`` owns."""
    c = chunk_size(numel, world_size)
    return min(rank * c, numel), min((rank + 1) * c, numel)


def padded(flat: torch.Tensor, world_size: int) -> torch.Tensor:
    """``flat`` (n,) followed by zeros up to (N * c,); no copy when n already divides."""
    extra = chunk_size(flat.numel(), world_size) * world_size - flat.numel()
    return flat if extra == 0 else torch.cat([flat, flat.new_zeros(extra)])


def all_reduce_mean_(tensor: torch.Tensor) -> torch.Tensor:
    """In place: every rank's ``tensor`` becomes the mean over ranks (DDP's gradient average)."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.div_(dist.get_world_size())


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    """Each rank's chunk of the mean over ranks of ``full`` (any shape): a new (c,) tensor.

    Rank r receives sum_k full_k[r*c:(r+1)*c] / N and nothing else: the same volume on the
    wire as half an all-reduce, and only c instead of n elements to keep.
    """
    world = dist.get_world_size()
    flat = padded(full.reshape(-1), world)                   # (N * c,)
    mine = flat.new_empty(flat.numel() // world)             # (c,)
    dist.reduce_scatter_tensor(mine, flat, op=dist.ReduceOp.SUM)
    return mine.div_(world)


def all_gather_into_(full: torch.Tensor, mine: torch.Tensor) -> torch.Tensor:
    """In place: ``full`` (n elements) becomes the concatenation of all ranks' chunks.

    ``mine``: this rank's real elements (hi - lo <= c of them); padded to c before sending.
    """
    world = dist.get_world_size()
    c = chunk_size(full.numel(), world)
    send = mine.reshape(-1)
    if send.numel() < c:
        send = torch.cat([send, send.new_zeros(c - send.numel())])  # (c,)
    gathered = send.new_empty(c * world)                     # (N * c,)
    dist.all_gather_into_tensor(gathered, send.contiguous())
    full.view(-1).copy_(gathered[: full.numel()])            # drop the padding
    return full
