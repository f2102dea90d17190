"""The training loops notebook 20 shows: plain DDP over a rank's own batches, the same under
``Join``, and the loop that reads its batches from the global cursor.

Nothing here counts or times: the drills (drills.py) wrap the batches and the steps to see
what happened, and the Slurm job (train.py) passes ``on_step`` to log what each step read.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join

from source_code.data_at_scale.model import collate, weighted_loss


def run_batches(model, optimizer, batches) -> int:
    steps = 0
    for x, y, w in batches:
        loss = weighted_loss(model, x, y, w)
        optimizer.zero_grad()
        loss.backward()            # DDP all-reduces the gradients here: every rank must take part
        optimizer.step()
        steps += 1
    return steps


def train_epoch(model, optimizer, batches) -> int:
    """Plain DDP: each rank runs its own batches, then meets the others at the epoch's end."""
    steps = run_batches(model, optimizer, batches)
    dist.barrier()                 # the epoch's end (validation, a snapshot): every rank meets here
    return steps


def train_epoch_joined(model, optimizer, batches, resync_optimizer: bool = True) -> int:
    """The same under torch's Join: a rank out of batches answers the others' all-reduces with
    zeros until every rank is done. DDP keeps dividing by the world size it started with
    (its join hook's divide_by_initial_world_size=True), so every sample keeps the same weight
    in the last steps too, which then move the weights less, having fewer samples.

    At the end Join broadcasts the model of the last rank to finish, and nothing else: the
    ranks that finished early skipped the last ``optimizer.step()``s, so their optimizer state
    (AdamW's moments and step count) is behind, and so would be an LR scheduler's and a
    GradScaler's: ``sync_optimizer`` gives them the same state (pass those to it too)."""
    with Join([model]):
        steps = run_batches(model, optimizer, batches)
    if resync_optimizer:
        sync_optimizer(optimizer, steps)
    dist.barrier()
    return steps


def sync_optimizer(optimizer, steps: int, *others) -> None:
    """Every rank takes the state of the rank that finished last (the one whose model Join
    broadcast: the most steps, the highest rank on a tie): the optimizer's, and that of each of
    ``others`` (anything with ``state_dict``/``load_state_dict``: the LR scheduler and the
    GradScaler, which the early ranks also stepped fewer times). The states travel pickled
    (``broadcast_object_list``) with every tensor moved to the CPU first, so no CUDA tensor is
    pickled; the optimizer's ``load_state_dict`` moves its state to its parameters' device."""
    taken = [None] * dist.get_world_size()
    dist.all_gather_object(taken, steps)
    last = max(range(len(taken)), key=lambda r: (taken[r], r))
    owners = [optimizer, *others]
    states = [_on_cpu([owner.state_dict() for owner in owners])]
    dist.broadcast_object_list(states, src=last)
    for owner, state in zip(owners, states[0]):
        owner.load_state_dict(state)


def _on_cpu(obj):
    """``obj`` with every tensor in its dicts, lists and tuples copied to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {key: _on_cpu(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(value) for value in obj)
    return obj


def train_from_cursor(model, optimizer, cursor, samples, rank: int, world: int,
                      stop_after: int | None = None, on_step=None, device="cpu") -> int:
    """From the cursor to the end of its epoch (or ``stop_after`` steps): the same steps on every rank."""
    epoch, done = cursor.epoch, 0
    while cursor.epoch == epoch and done != stop_after:
        ids = cursor.batch_for(rank, world)        # this rank's ids for this step (the exercise of section 6)
        x, y, w = collate(samples, ids, device)
        # this rank's summed sample losses over (the global batch's real samples / world): DDP's
        # mean over the ranks then gives the mean over the global batch's real samples, pads weigh 0
        loss = weighted_loss(model, x, y, w, cursor.real_in_batch() / world)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if on_step is not None:
            on_step(ids)
        cursor.advance()
        done += 1
    return done
