"""Run on every rank (processes.spawn): CP on a whole TransformerLM step against one process,
and the four typical mistakes, each measured against the same reference.

``report`` builds the same model (workload.build_model, one seed) and the same global batch on
every rank: 4 samples of the sort task whose answers are cut short after COUNTS valid targets
(the rest is padding, target -100), so that the ranks hold different numbers of scored tokens.
The reference is one process on the full sequences of the full batch: workload.lm_loss over
every valid target, its loss and gradients. Then, on the job's DP x CP grid (``grid``):
model_step.train_step with each attention family, and ``mistaken_step`` with each mistake; per
run the |difference| of the loss and the largest |difference| of any gradient from the
reference. ``mistaken_step`` with ``mistake=None`` is train_step's lines again (a test holds
them bitwise equal), and each mistake changes one of them:

* "local positions": position ids 0..T/cp-1 on every rank, instead of the tokens' own;
* "labels shifted after the split": each rank makes its labels from its own tokens, so the last
  token of each chunk has no next token to predict (it is on another rank) and loses its label;
* "mean of per-rank means": each rank's mean loss over its own valid targets, averaged over
  the ranks (what DDP's gradient average does), instead of the sum over the global count;
* "gradients reduced over DP only": the all-reduce skips the CP ranks.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code import data, workload
from source_code.context_parallel import families
from source_code.context_parallel import layout as lay
from source_code.context_parallel import model_step as ms
from source_code.context_parallel.harness import max_diff, say
from source_code.distributed import context

COUNTS = (16, 12, 3, 9)        # valid targets kept per sample of the global batch
SEED = 0
LAYOUT = "zigzag"
MISTAKES = ("local positions", "labels shifted after the split", "mean of per-rank means",
            "gradients reduced over DP only")


def grid(world: int) -> tuple[int, int]:
    """The (dp, cp) grid a job of ``world`` processes runs: DP 1 x CP 2 on 2, DP 2 x CP world/2
    on an even number from 4, DP 1 x CP world on an odd number."""
    return (2, world // 2) if world >= 4 and world % 2 == 0 else (1, world)


def answer_length(cp: int) -> int:
    """Tokens of the sort task's answer: >= 16 and a multiple of cp (so that the 2 x answer
    tokens of a sequence cut into 2 x cp zigzag chunks)."""
    return cp * -(-16 // cp)


def uneven_batch(length: int, counts=COUNTS, device="cpu"):
    """(inputs, targets) (len(counts), 2 x length): sample i scores its first counts[i] answer tokens."""
    dataset = data.sequence_task("sort", n=64, length=length)
    x, y = workload.global_batch(dataset, 0, len(counts), SEED)
    y = y.clone()
    for row, keep in zip(y, counts):
        row[(row != -100).nonzero().flatten()[keep:]] = -100          # the cut-off answer: padding
    return x.to(device), y.to(device)


def model_config(length: int) -> dict:
    return workload.model_config(max_len=max(64, 2 * length))


def reference(cfg: dict, inputs, targets):
    """One process, full sequences, full batch: (loss, {name: gradient})."""
    model = workload.build_model(cfg, SEED, inputs.device)
    loss = workload.lm_loss(model(inputs), targets, int((targets != -100).sum()))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def shift_after_split(tokens, labels, layout: str = LAYOUT):
    """The labels a rank makes from its own tokens, chunk by chunk: each token's next token in
    its chunk; the chunk's last token gets -100 (its next token is on another rank). Where the
    data scores nothing (labels -100) stays -100."""
    size = tokens.shape[1] // lay.chunks_per_rank(layout)
    made = torch.full_like(tokens, -100)
    for start in range(0, tokens.shape[1], size):
        made[:, start:start + size - 1] = tokens[:, start + 1:start + size]
    return made.masked_fill(labels == -100, -100)


def mistaken_step(model, inputs, targets, g: ms.Groups, mistake: str | None, family: str = "ring",
                  layout: str = LAYOUT):
    """model_step.train_step with one of MISTAKES (None: none)."""
    if mistake not in (None, *MISTAKES):
        raise ValueError(f"mistake must be None or one of {MISTAKES}, got {mistake!r}")
    tokens, positions, labels = ms.split_sequence(inputs, targets, g.cp_rank, g.cp, layout)
    if mistake == "local positions":
        positions = torch.arange(tokens.shape[1], device=tokens.device)
    if mistake == "labels shifted after the split":
        labels = shift_after_split(tokens, labels, layout)
    core = functools.partial(families.attention, family, causal=True, layout=layout, group=g.cp_group)
    logits = ms.cp_logits(model, tokens, positions, core)
    if mistake == "mean of per-rank means":
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100) / (g.dp * g.cp)
    else:
        loss = ms.global_token_loss(logits, labels, g.dp_cp_group)
    loss.backward()
    ms.reduce_gradients(model, g.dp_group if mistake == "gradients reduced over DP only" else g.dp_cp_group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=g.dp_cp_group)
    return total


def compared(run, cfg, inputs, targets, ref) -> dict:
    """|loss - reference| and the largest |gradient - reference| of a fresh model after ``run``."""
    model = workload.build_model(cfg, SEED, inputs.device)
    loss = run(model, inputs, targets)
    grads = max(max_diff(p.grad, ref[1][n]) for n, p in model.named_parameters())
    return {"loss": loss.item(), "loss_diff": abs(loss.item() - ref[0].item()), "grad_diff": grads}


def one_grid(dp: int, cp: int, cfg, batch, ref) -> dict:
    """Every family and every mistake on a DP x CP grid, this rank's view."""
    g = ms.mesh_groups(dp, cp, context().device.type)
    inputs, targets = workload.rank_slice(batch, g.dp_rank, dp)          # my DP rank's samples
    tokens, positions, labels = ms.split_sequence(inputs, targets, g.cp_rank, cp, LAYOUT)
    made = shift_after_split(tokens, labels)
    fam = {f: compared(functools.partial(ms.train_step, g=g, family=f, layout=LAYOUT), cfg, inputs, targets, ref)
           for f in families.FAMILIES if f != "ulysses" or cfg["n_heads"] % cp == 0}
    bad = {m: compared(functools.partial(mistaken_step, g=g, mistake=m), cfg, inputs, targets, ref)
           for m in MISTAKES}
    return {"dp": dp, "cp": cp, "dp_rank": g.dp_rank, "cp_rank": g.cp_rank,
            "positions": positions.tolist(), "valid": int((labels != -100).sum()),
            "labels_lost": int((labels != -100).sum() - (made != -100).sum()),
            "families": fam, "mistakes": bad}


def report(verbose: bool = False) -> dict:
    """Run on every rank: the reference, then this job's grid (see the module docstring)."""
    world, device = dist.get_world_size(), context().device
    dp, cp = grid(world)
    length = answer_length(cp)
    cfg, batch = model_config(length), uneven_batch(length, device=device)
    ref = reference(cfg, *batch)
    out = one_grid(dp, cp, cfg, batch, ref)
    worst = max(r["grad_diff"] for r in out["families"].values())
    say(f"model step, DP {dp} x CP {cp}: largest |gradient difference| from one process {worst:.1e}", verbose)
    return {**out, "rank": dist.get_rank(), "world": world, "seq": 2 * length, "batch": len(COUNTS),
            "counts": COUNTS, "ref_loss": ref[0].item(),
            "ref_grad_max": max(g.abs().max().item() for g in ref[1].values())}
