"""Notebook 09's reading of the FSDP-by-hand walk at width 4096 (own_fsdp_predict.py) in words:
what the overlap hides and which transfers the computation still waits for.

    from source_code.sharding.own_fsdp_text import largest_unit, memory_reading, walk_reading

Also the bytes held per rank by FSDP by hand, fully_shard and DDP (own_fsdp_report.py's counts).
"""
from __future__ import annotations


def as_ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f} ms"


def walk_reading(pred: dict, names: list, n_replicated: int, n_ranks: int, alpha_s: float) -> str:
    """pred: own_fsdp_predict's walks ("dim4096": serial and overlap at width 4096, "this_model");
    names: the units in forward order; n_replicated: the replicated (LayerNorm) parameters, each
    all-reduced apart in 2(N-1) messages of latency alpha_s."""
    wide = pred["dim4096"]
    serial_walk, overlap_walk = wide["serial"], wide["overlap"]
    waited = overlap_walk["exposed_s"]          # {"forward" | "backward" (gathers) | "reduce": {unit: s}}
    reduce_total = sum(overlap_walk["reduce_s"].values())
    reduce_waited = sum(waited["reduce"].values())
    reduce_waited_serial = sum(serial_walk["exposed_s"]["reduce"].values())   # each waited for when issued
    reduce_hidden = [unit for unit in names if unit not in waited["reduce"]]
    reduce_exposed = ", ".join(f"{unit} ({as_ms(s)})" for unit, s in waited["reduce"].items())
    embedding_regathers = waited["backward"].get("tok", 0.0) + waited["backward"].get("pos", 0.0)
    norm_latency = n_replicated * 2 * (n_ranks - 1) * alpha_s
    step_text = (
        f"On the GPU node, at width 4096 with {as_ms(serial_walk['step_s'])} of step, the overlap hides "
        f"{overlap_walk['hidden_fraction']:.0%} of {as_ms(overlap_walk['comm_s'])} of transfers, which are "
        f"{overlap_walk['comm_s'] / serial_walk['step_s']:.1%} of the step, and moves the step by "
        f"{as_ms(serial_walk['step_s'] - overlap_walk['step_s'])}. Each instant the "
        f"computation waits is booked to the transfer that has the link then.")
    forward_text = (
        f"Forward: the gathers of {', '.join(wide['exposed_forward'])} wait in full: the first has nothing "
        f"before it, and an embedding lookup has no FLOPs, so the gathers after the embeddings have nothing "
        f"to hide under; from the second block on each gather hides under the block before it.")
    backward_text = (
        f"Backward: the head's gather waits ({as_ms(waited['backward']['head'])}, the first of the backward). "
        f"Of {as_ms(reduce_total)} of reduce-scatters the computation waits for {as_ms(reduce_waited)}, "
        f"{1 - reduce_waited / reduce_total:.0%} hidden ({as_ms(reduce_waited_serial)} waited for when each is "
        f"waited for as soon as it is issued): those of {', '.join(reduce_hidden)} hide under the next block's "
        f"backward, those of {reduce_exposed} do not: after layers.0 only the embeddings are left, whose "
        f"backward the model counts at no FLOPs. The embeddings' own gathers wait {as_ms(embedding_regathers)} "
        f"more, and they are wasted: an embedding's backward reads only the token ids, not its weight, so the "
        f"lesson's hooks gather those two units again for nothing (FSDP2 skips that gather for a group marked "
        f"`set_unshard_in_backward(False)`, whose docstring names the embedding). Not in the model: the "
        f"{n_replicated} LayerNorm gradients' all-reduces, blocking, one per replicated parameter, "
        f"about {as_ms(norm_latency)} of latency a step on this node.")
    small_text = (
        f"For the small model of this run the model hides {pred['this_model']['overlap']['hidden_fraction']:.0%}: "
        f"a unit computes for less than a message's latency.")
    return "\n\n".join([step_text, forward_text, backward_text, small_text])


def as_kib(nbytes: float) -> str:
    return f"{nbytes / 2**10:.1f} KiB"


def largest_unit(at_units: dict) -> str:
    """The unit at whose post-backward the most bytes are held (full parameters, gradients, in flight)."""
    return max(at_units, key=lambda unit: sum(at_units[unit].values()))


def memory_reading(own: dict, padded_here: int) -> str:
    """own: own_fsdp_report.run's results (bytes per implementation with the backward's parts,
    the prefetch timeline, parity); padded_here: the padding elements of the flat units at this N."""
    held, own_parity, n_ranks = own["bytes"], own["parity"], own["world_size"]
    own_bytes, ddp_bytes, fsdp2_bytes = held["own_fsdp"], held["ddp"], held["fully_shard"]
    parts, prefetched, fsdp2_units = own_bytes["backward_parts"], own["timeline"]["overlapped"], fsdp2_bytes["at_units"]
    largest = largest_unit(prefetched["at_units"])     # the unit whose full gradient completes at the peak
    at_block1 = prefetched["at_units"]["layers.1"]
    fsdp2_largest = largest_unit(fsdp2_units)
    fsdp2_peak_parts = fsdp2_units[fsdp2_largest]
    fp64, fp32 = own_parity["own_fsdp_fp64"], own_parity["own_fsdp"]
    fp64_fsdp2, fp32_fsdp2 = own_parity["fully_shard_fp64"], own_parity["fully_shard"]
    resident_text = (
        f"Per rank between units FSDP by hand keeps {own['state_ratio']:.3f} of DDP's bytes (1/{n_ranks} of the "
        f"sharded part, plus the replicated LayerNorms and AdamW's step counters; {padded_here} elements of "
        f"padding at N = {n_ranks}); `fully_shard` keeps {fsdp2_bytes['resident'] / ddp_bytes['resident']:.3f}. "
        f"While block 0 computes, FSDP by hand "
        f"adds that block's full parameters ({as_kib(own_bytes['gathered'])}), `fully_shard` "
        f"{as_kib(fsdp2_bytes['gathered'])}: the block plus its root group (embeddings, final norm, head), which "
        f"FSDP2 keeps gathered through the whole forward.")
    backward_text = (
        f"The backward holds more: at its largest sample {own['backward_peak_ratio']:.3f} of DDP's "
        f"({as_kib(own_bytes['backward_peak'])} against {as_kib(ddp_bytes['backward_peak'])}): the sharded state "
        f"so far ({as_kib(parts['state'])}), a block's full parameters ({as_kib(parts['full_params'])}) and its "
        f"full gradient ({as_kib(parts['full_grads'])}), and the previous block's gradient still in its "
        f"reduce-scatter with the chunk it returns ({as_kib(parts['in_flight'])}). With prefetch (below) it is "
        f"{prefetched['backward_peak'] / ddp_bytes['backward_peak']:.3f} of DDP's: when layers.1's gradient "
        f"completes, two blocks are full "
        f"({as_kib(at_block1['full_params'])}), but the gradient in flight then is the head's "
        f"({as_kib(at_block1['in_flight'])}); the largest sample is at {largest}'s gradient, where nothing is "
        f"prefetched (the embeddings gather when they start). DDP's count is its resident state. Left out on "
        f"both sides: DDP's gradient buckets (one more copy of the gradients, so DDP's real peak is higher), "
        f"activations, and operators' transients.")
    fsdp2_text = (
        f"`fully_shard` peaks at {fsdp2_bytes['backward_peak'] / ddp_bytes['backward_peak']:.3f} of DDP's "
        f"({as_kib(fsdp2_bytes['backward_peak'])}), at "
        f"{fsdp2_largest}'s post-backward: {as_kib(fsdp2_peak_parts['full_params'])} of full parameters, the block "
        f"and the root group ({as_kib(fsdp2_units['root']['full_params'])}), which section 3's "
        f"`reshard_after_forward=True` reshards after the forward, so the backward gathers it again first and "
        f"keeps it to its end; {as_kib(fsdp2_peak_parts['full_grads'])} of full gradients (the block's, the "
        f"head's and the final norm's so far); and layers.1's reduce-scatter input "
        f"({as_kib(fsdp2_peak_parts['in_flight'])}; its output is the shard's gradient, counted in the state). "
        f"FSDP by hand frees its head after the head's backward, and holds the chunk a reduce-scatter returns "
        f"apart from the shard's gradient until its wait.")
    parity_text = (
        f"Weights after {own['steps']} steps in fp64: FSDP by hand {fp64['max_abs_diff']:.2g} from one process, "
        f"`fully_shard` {fp64_fsdp2['max_abs_diff']:.2g}; in fp32 {fp32['max_abs_diff']:.2g} and "
        f"{fp32_fsdp2['max_abs_diff']:.2g}, the two {own_parity['own_fsdp_vs_fully_shard']['max_abs_diff']:.2g} apart. "
        f"The largest fp32 difference from one process lies in `{fp32['worst']}` by hand and in "
        f"`{fp32_fsdp2['worst']}` with `fully_shard`.")
    return "\n\n".join([resident_text, backward_text, fsdp2_text, parity_text])
