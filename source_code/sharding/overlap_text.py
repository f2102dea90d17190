"""Notebook 09's reading of overlap.py's three variants in words (the cell asserts the claims;
this only words them).

    from source_code.sharding.overlap_text import reading
"""
from __future__ import annotations


def _verdict(gap: dict, sync: float) -> str:
    """The paired step-time gap of the prefetch lists against FSDP2's default (overlap.paired_gap)."""
    rounds = ", ".join(f"{d:+.0f}" for d in gap["diffs"])
    head = (f"The lists' steps minus the default's, round by round: {rounds} ms; mean {gap['mean']:+.0f} ± "
            f"{gap['se']:.0f} ms (standard error), ")
    if gap["resolved"]:
        return head + (f"more than {gap['t']} standard errors from 0, with the same collectives and at most "
                       f"{sync:.0%} of the all-gathers hidden: this run does not say where that time goes.")
    return head + (f"less than the {gap['t']} standard errors that {len(gap['diffs'])} rounds need: this run "
                   f"cannot tell the two step times apart.")


def reading(variants: dict, gap: dict, sync: float) -> str:
    """variants: overlap.run_variants' results; gap: paired_gap(none's steps, prefetch's steps);
    sync: the larger hidden share of the all-gathers issued synchronously."""
    none, lists, with_async = variants["none"], variants["prefetch"], variants["prefetch_async"]
    return (f"Gathers issued ahead of their block: {with_async['ahead']} with the prefetch lists, {none['ahead']} "
            f"without. All-gather time under the main thread's computation: {none['gather_hidden_fraction']:.0%} "
            f"with FSDP2's default, {lists['gather_hidden_fraction']:.0%} with the prefetch lists, "
            f"{with_async['gather_hidden_fraction']:.0%} with the lists and asynchronous issue. Steps (interleaved, "
            f"each timed alone) of {none['step_ms']:.0f}, {lists['step_ms']:.0f} and {with_async['step_ms']:.0f} ms "
            f"on average. " + _verdict(gap, sync))
