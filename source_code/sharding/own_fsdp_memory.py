"""Bytes of training state one rank holds, counted from storages, for own_fsdp_report.py.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report   # prints them

Counted with measure.tensor_bytes (distinct storages; a freed full buffer counts 0 bytes):

* resident: parameters + gradients + optimizer state after a step (before zero_grad), own
  FSDP's full buffers included (0 bytes then): what stays between units;
* gathered: full parameters that exist on top while block 0 computes its forward (counted
  inside its forward); forward peak = resident + gathered;
* backward peak: the training state sampled, not every byte at every moment: the largest count
  over one backward of the parameters (shards, replicated,
  every unit's full buffer), their gradients (every full buffer's too), the inputs and outputs
  of the reduce-scatters in flight, and the optimizer state. Counted whenever a gradient is
  complete: when a unit's full gradient is (before its reduce-scatter is issued: its full
  parameters, its full gradient and the previous unit's gradient in flight are all alive), when
  any other parameter's is, and once the backward has returned. ``parts`` splits the peak
  into "state" (parameters, gradients, optimizer), "full_params", "full_grads", "in_flight".
  DDP's own gradient buckets (another copy of the gradients inside its reducer) are not
  counted: its peak is higher than the count. ``FSDP2BackwardPeak`` counts ``fully_shard``'s the
  same way, as each of its groups' post-backward starts, from FSDP2's own objects. Activations are not counted on either side, nor
  what an operator holds while it runs (own_fsdp.Unit makes the views with one torch.split, so
  its backward concatenates the views' gradients into the one full gradient).
"""
from __future__ import annotations

import torch

from source_code.measure import optimizer_tensors, state_bytes, tensor_bytes


def measure_bytes(model, opt, inner, gathered, x) -> dict:
    """Resident state after the step, and what a unit's forward gathers on top (block 0)."""
    extra = [u.full for u in getattr(inner, "own_fsdp_units", [])]
    resident = state_bytes(model, opt, extra_params=extra)["total"]
    seen = []
    probe = inner.layers[0].register_forward_pre_hook(lambda m, a: seen.append(gathered()))
    with torch.no_grad():
        model(x)                        # one forward: the hooks gather and free as in training
    probe.remove()
    after = state_bytes(model, opt, extra_params=extra)["total"]
    assert after == resident, f"{after} bytes resident after the forward, {resident} before"
    return {"resident": resident, "gathered": seen[0], "peak": resident + seen[0]}


class BackwardPeak:
    """``with BackwardPeak(model, opt, inner) as peak: loss.backward()``; then peak.peak, peak.parts,
    and peak.at_units: {unit: its parts} counted as each unit's full gradient completes."""

    def __init__(self, model, opt, inner):
        self.model, self.opt = model, opt
        self.units = list(getattr(inner, "own_fsdp_units", []))
        self.peak, self.parts, self.handles, self.at_units = 0, {}, [], {}

    def tensors(self) -> dict:
        """{part: the tensors it holds now}, parts in order (a tensor counts in its first part)."""
        params = list(self.model.parameters())
        return {"state": params + [p.grad for p in params] + optimizer_tensors(self.opt),
                "full_params": [u.full for u in self.units],
                "full_grads": [u.full.grad for u in self.units],
                "in_flight": [t for u in self.units if u.reducing for t in u.reducing[1:]]}

    def count(self, unit_name: str | None = None) -> None:
        groups = self.tensors()
        parts, counted = {}, []
        for name, tensors in groups.items():
            parts[name] = tensor_bytes(tensors, exclude=counted)
            counted += [t for t in tensors if t is not None]
        if unit_name is not None:
            self.at_units[unit_name] = parts
        if sum(parts.values()) > self.peak:
            self.peak, self.parts = sum(parts.values()), parts

    def __enter__(self):
        self.saved = {u: u.__dict__.get("reduce_grad") for u in self.units}   # another wrapper, if any
        for u in self.units:
            def reduce_grad(u=u, inner=u.reduce_grad):
                self.count(u.name)           # full parameters, full gradient, older one in flight
                inner()
            u.reduce_grad = reduce_grad
        self.handles = [p.register_post_accumulate_grad_hook(lambda p: self.count())
                        for p in self.model.parameters() if p.requires_grad]
        return self

    def __exit__(self, *exc):
        self.count()
        for u, before in self.saved.items():
            if before is None:
                del u.reduce_grad            # the class's method again
            else:
                u.reduce_grad = before
        for h in self.handles:
            h.remove()
        return False


def padding(cfg: dict, world: int) -> dict:
    """Zeros added to shard a TransformerLM ``cfg`` over ``world`` ranks: FSDP by hand pads each
    unit's flat vector to a multiple of N elements; FSDP2 pads each parameter on dim 0 to a
    multiple of N rows (a 1-D parameter's rows are its elements). LayerNorms left out (by hand
    they are not sharded)."""
    from source_code.models import TransformerLM
    from source_code.sharding.own_fsdp import REPLICATED, default_units
    with torch.device("meta"):
        model = TransformerLM(**cfg)
    flat = dim0 = 0
    for _, module in default_units(model):
        params = [p for m in module.modules() if not isinstance(m, REPLICATED)
                  for p in m.parameters(recurse=False)]
        n = sum(p.numel() for p in params)
        flat += -(-n // world) * world - n
        dim0 += sum((-(-p.shape[0] // world) * world - p.shape[0]) * (p.numel() // p.shape[0]) for p in params)
    return {"flat_per_unit": flat, "dim0_per_parameter": dim0}


def fsdp2_groups(model) -> list:
    """FSDP2's parameter groups of ``model`` (one per ``fully_shard`` call), with their names."""
    found = []
    for name, module in model.named_modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
        found += [(name or "root", g) for g in groups if g is not None]
    return found


class FSDP2BackwardPeak(BackwardPeak):
    """BackwardPeak for ``fully_shard``: counted as each group's post-backward starts (its
    unsharded gradients complete, its reduce-scatter not yet issued), from FSDP2's own objects
    (torch 2.14's ``_fsdp_param.py`` / ``_fsdp_param_group.py``): "state" the sharded parameters,
    their gradients and the optimizer state; "full_params" every group's unsharded parameters
    (0 bytes when resharded) and the all-gather outputs not yet copied out (a prefetched group's,
    the one FSDP2 keeps until the next copy-out); "full_grads" their unsharded gradients; "in_flight" the
    reduce-scatter inputs FSDP2 still holds (``reduce_scatter_states``)."""

    def __init__(self, model, opt):
        super().__init__(model, opt, model)
        self.groups = fsdp2_groups(model)

    def tensors(self) -> dict:
        fsdp_params = [p for _, g in self.groups for p in g.fsdp_params]
        sharded = [p.sharded_param for p in fsdp_params]
        full = [t for p in fsdp_params for t in [getattr(p, "_unsharded_param", None),
                                                  *getattr(p, "all_gather_outputs", [])]]
        gathering = [getattr(g, "_all_gather_result", None) for _, g in self.groups]   # prefetched, not copied out
        gathering += [getattr(getattr(g.comm_ctx, "all_gather_state", None), "all_gather_result", None)
                      for _, g in self.groups if hasattr(g, "comm_ctx")]
        full += [getattr(r, "all_gather_output", None) for r in gathering if r is not None]
        full_grads = [getattr(p, "_unsharded_param", None) for p in fsdp_params]
        comm = {id(g.comm_ctx): g.comm_ctx for _, g in self.groups if hasattr(g, "comm_ctx")}
        states = [s for c in comm.values() for s in (getattr(c, "reduce_scatter_states", None)
                                                      or [getattr(c, "reduce_scatter_state", None)])]
        return {"state": sharded + [p.grad for p in sharded] + optimizer_tensors(self.opt),
                "full_params": full,
                "full_grads": [p.grad for p in full_grads if p is not None],
                "in_flight": [getattr(s, "reduce_scatter_input", None) for s in states if s is not None]}

    def __enter__(self):
        for name, g in self.groups:
            def post_backward(*args, name=name, inner=g.post_backward):
                self.count(name)
                return inner(*args)
            g.post_backward = post_backward
        return self

    def __exit__(self, *exc):
        self.count()
        for _, g in self.groups:
            del g.post_backward              # the class's method again
        return False
