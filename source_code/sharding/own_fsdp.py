"""FSDP (ZeRO-3) built by hand: parameters that exist only as shards until a unit needs them.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report  # checks it

ZeRO-2 (zero.py) shards the optimizer state and the gradients; every rank still keeps the
whole model. ZeRO-3 shards the parameters too. The model is cut into **units**; here one unit
per module that owns the big matrices: the token embedding, the position embedding, each
transformer block, the LM head (one unit per block, as ``fully_shard`` per block; the
embeddings and the head apart, so no unit stays gathered for the whole forward as
``fully_shard``'s root group does). A unit's parameters are flattened into one vector,
padded to a multiple of N and cut into N chunks (comm.py); rank r keeps chunk r only:

    unit's parameters   wq | wk | wv | wo | up.w | up.b | down.w | down.b | pad
    flat, padded        (N * c,)   rank r's shard: (c,) = flat[r*c : (r+1)*c]

A step, per unit:

* forward pre-hook:  all-gather the shards into the unit's full buffer (N * c,) and make each
  parameter a view of it, so the module computes as if nothing happened;
* forward post-hook: free the full buffer (its storage shrinks to 0 bytes: the views and what
  autograd saved for backward point at that storage and see nothing until it is refilled);
* backward, before the unit's own backward (a hook on the unit's output gradient): all-gather
  again into the same storage, so what autograd saved reads the parameters again;
* when the full buffer's gradient is complete (post-accumulate-grad hook): free the full
  parameters and *issue* the reduce-scatter of the full gradient (``async_op=True``) without
  waiting: the backward of the units before it computes while the gradient travels;
* at most one reduce-scatter is in flight (``Reductions.limit``): a unit about to issue one first
  waits for the previous one, keeps that unit's (c,) chunk of the mean as its shard's gradient and
  lets go of its full gradient (the collective's input, alive until then). The last one is waited
  for once, after the whole backward, in a callback queued on autograd's engine. FSDP2 does the
  same: one reduce-scatter input kept in flight by default (``set_reduce_scatter_max_input_buffers``
  in torch 2.14), the rest waited for in the root's post-backward callback. ``limit=None`` waits
  for all of them only after backward, as a DDP by hand does (CS336's
  ``finish_gradient_synchronization``): every unit's full gradient then lives until the end;
* the optimizer (any torch optimizer) steps on the shards only: AdamW's state is (c,) a unit.

Not sharded: the LayerNorm weights and biases (norm1, norm2 of every block, the final norm).
They stay whole on every rank, as DDP keeps them, and their gradients are all-reduced
(averaged, waited for at once) as soon as each is ready; they are 2 x dim numbers each, under
1 % of the model.

``full_state_dict`` gathers every unit's shards into full tensors under the model's own
parameter names, for saving or comparing.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from source_code.sharding import comm

REPLICATED = (nn.LayerNorm,)   # modules whose parameters stay whole on every rank


def free_storage(t: torch.Tensor) -> None:
    """Release ``t``'s memory but keep the tensor (and every view of it) alive: 0 bytes."""
    t.untyped_storage().resize_(0)


def alloc_storage(t: torch.Tensor) -> None:
    """Give ``t`` back memory for all of its elements (contents undefined until filled)."""
    t.untyped_storage().resize_(t.numel() * t.element_size())


class Reductions:
    """The reduce-scatters in flight of one model's units, oldest first: at most ``limit`` (None:
    no limit); the rest are finished once, when autograd's engine has run the whole backward."""

    def __init__(self, limit: int | None = 1):
        self.limit, self.units, self.callback_queued = limit, [], False

    def add(self, unit: "Unit") -> None:
        """``unit`` is about to issue its reduce-scatter: make room for it."""
        if not self.callback_queued:          # the first of this backward: finish the rest at its end
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_all)
            self.callback_queued = True
        while self.limit is not None and len(self.units) >= self.limit:
            self.units.pop(0).finish_reduce()
        self.units.append(unit)

    def finish_all(self) -> None:
        while self.units:
            self.units.pop(0).finish_reduce()
        self.callback_queued = False


class Slot(NamedTuple):
    """One parameter of a unit: the module that owns it, its attribute there, its qualified name,
    its shape, and where it starts in the unit's flat vector."""
    owner: nn.Module
    attr: str
    name: str
    shape: torch.Size
    offset: int


class Unit:
    """One sharded unit: ``module``'s parameters (those outside REPLICATED submodules) as a flat
    padded shard ``self.shard`` (c,), a full buffer ``self.full`` (N * c,) that holds memory only
    while the unit computes, and the hooks that gather, free and reduce-scatter."""

    param_dtype = None        # dtype of the full buffer (the gathered parameters); None: the shard's

    def __init__(self, name: str, module: nn.Module, world: int, rank: int):
        self.name, self.module, self.world, self.rank = name, module, world, rank
        self.slots: list[Slot] = []      # where each parameter lives in the flat vector
        flats, offset = [], 0
        for owner_name, owner in module.named_modules():
            if isinstance(owner, REPLICATED):
                continue
            for attr, p in list(owner.named_parameters(recurse=False)):
                qual = ".".join(x for x in (name, owner_name, attr) if x)
                self.slots.append(Slot(owner, attr, qual, p.shape, offset))
                flats.append(p.detach().reshape(-1))
                offset += p.numel()
                del owner._parameters[attr]             # the module no longer owns it
        if not flats:
            raise ValueError(f"unit {name!r} has no parameters to shard; choose a module with "
                             "Linear or Embedding weights")
        self.numel = offset                                    # real elements, no padding
        flat = comm.padded(torch.cat(flats), world)            # (N * c,)
        c = flat.numel() // world
        self.shard = nn.Parameter(flat[rank * c:(rank + 1) * c].clone())  # (c,) the only copy
        module.register_parameter("flat_shard", self.shard)    # model.parameters() sees it
        # (N * c,) leaf: the views' gradients add up in full.grad; memory only while in use
        self.full = torch.empty(flat.numel(), dtype=self.param_dtype or flat.dtype, device=flat.device,
                                requires_grad=True)
        free_storage(self.full)
        del flat, flats
        self.reductions = Reductions()     # shard_by_hand shares one among a model's units
        self.reducing = None               # (Work, my chunk (c,), full gradient) while in flight
        self.hooks = {"forward_pre": module.register_forward_pre_hook(lambda m, args: self.unshard()),
                      "forward": module.register_forward_hook(lambda m, args, out: self.after_forward(out)),
                      "full_grad": self.full.register_post_accumulate_grad_hook(lambda full: self.reduce_grad())}

    # ------------------------------------------------------------------ the algorithm
    def gather(self) -> None:
        """All-gather every rank's shard into the full buffer's storage."""
        alloc_storage(self.full)
        # .data: the same storage, but writing it does not bump the version autograd checks
        # for the tensors it saved (they point at this storage and must read the new values)
        dist.all_gather_into_tensor(self.full.data, self.shard.detach())

    def unshard(self) -> None:
        """Forward pre-hook: gather, then each parameter becomes a view of the full buffer."""
        self.gather()
        sizes = [slot.shape.numel() for slot in self.slots]
        # one split (as FSDP1's FlatParameter): its backward concatenates the views' gradients
        # into one (N * c,) tensor; a slice per view would build a zero-filled (N * c,) each
        pieces = torch.split(self.full, sizes + [self.full.numel() - self.numel])  # last: padding
        for slot, piece in zip(self.slots, pieces):
            setattr(slot.owner, slot.attr, piece.view(slot.shape))                # tracked by autograd

    def after_forward(self, out):
        """Forward post-hook: free the full parameters; gather them again in backward."""
        free_storage(self.full)
        if torch.is_tensor(out) and out.requires_grad:
            out.register_hook(lambda grad: self.before_backward())  # before this unit's backward
        return out

    def before_backward(self) -> None:
        self.gather()

    def reduce_grad(self) -> None:
        """The full gradient is complete: free the full parameters, start the reduce-scatter."""
        grad, self.full.grad = self.full.grad, None          # (N * c,) this rank's full gradient
        free_storage(self.full)
        self.start_reduce(grad)

    def start_reduce(self, grad: torch.Tensor) -> None:
        """Issue the reduce-scatter of ``grad`` (N * c,) and return at once (async_op=True)."""
        self.reductions.add(self)                            # waits for the oldest if at the limit
        mine = grad.new_empty(grad.numel() // self.world)    # (c,) will hold my chunk of the sum
        work = dist.reduce_scatter_tensor(mine, grad, op=dist.ReduceOp.SUM, async_op=True)
        self.reducing = (work, mine, grad)                   # grad is its input: alive until done

    def finish_reduce(self) -> None:
        """Wait for my reduce-scatter; my chunk of the mean becomes the shard's gradient."""
        work, mine, _ = self.reducing
        work.wait()
        self.reducing = None                                 # the full gradient goes
        mine.div_(self.world)
        self.shard.grad = mine if self.shard.grad is None else self.shard.grad + mine

    # ------------------------------------------------------------------ bookkeeping
    def gathered_bytes(self) -> int:
        """Bytes the full buffer holds now: N * c * element size while gathered, else 0."""
        return self.full.untyped_storage().nbytes()

    @torch.no_grad()
    def full_tensors(self) -> dict:
        """{qualified name: full tensor}, gathered from the shards (collective: every rank)."""
        out = self.shard.new_empty(self.shard.numel() * self.world)   # (N * c,)
        dist.all_gather_into_tensor(out, self.shard.detach())
        return {slot.name: out[slot.offset:slot.offset + slot.shape.numel()].view(slot.shape).clone()
                for slot in self.slots}


def default_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The units of a TransformerLM: tok, pos, every block, head (named as in the model)."""
    return ([("tok", model.tok), ("pos", model.pos)]
            + [(f"layers.{i}", block) for i, block in enumerate(model.layers)]
            + [("head", model.head)])


def average_gradient_hook(p: torch.Tensor) -> None:
    """Post-accumulate-grad hook of a replicated parameter: all-reduce its gradient (mean)."""
    comm.all_reduce_mean_(p.grad)


def shard_by_hand(model: nn.Module, units=None, unit_class=None, limit: int | None = 1) -> list[Unit]:
    """Shard ``model`` in place (ZeRO-3): one Unit per (name, module) of ``units`` (default:
    ``default_units``); every parameter left outside them is replicated and its gradient
    all-reduced. Build the optimizer afterwards, on ``model.parameters()``. ``unit_class``:
    a subclass of Unit (own_fsdp_prefetch.PrefetchUnit); ``limit``: reduce-scatters in flight."""
    world, rank = dist.get_world_size(), dist.get_rank()
    make = unit_class or Unit
    made = [make(name, module, world, rank) for name, module in (units or default_units(model))]
    reductions = Reductions(limit)
    for u in made:
        u.reductions = reductions
    sharded = {id(u.shard) for u in made}
    for p in model.parameters():
        if id(p) not in sharded and p.requires_grad:
            p.register_post_accumulate_grad_hook(average_gradient_hook)
    model.own_fsdp_units = made
    return made


def replicated_names(model: nn.Module) -> list[str]:
    """Names of the parameters every rank keeps whole (all but the units' shards)."""
    shards = {id(u.shard) for u in model.own_fsdp_units}
    return [n for n, p in model.named_parameters() if id(p) not in shards]


@torch.no_grad()
def full_state_dict(model: nn.Module) -> dict:
    """{name: full tensor} with the original model's names (collective: call on every rank)."""
    out = {}
    for unit in model.own_fsdp_units:
        out.update(unit.full_tensors())
    for name in replicated_names(model):
        out[name] = model.get_parameter(name).detach().clone()
    return out
