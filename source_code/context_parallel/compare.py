"""Ring attention against full attention on 2 and 4 processes, the layouts' work, torch's API.

    python -m source_code.context_parallel.compare
    python -m source_code.context_parallel.compare --worlds 2 --device auto    # a node with >= 2 GPUs

For each world size, ``report`` runs on every rank (processes.spawn): outputs and gradients
of q, k, v from ring attention (contiguous and zigzag, causal and not) against full attention
on one process (harness.parity), the query-key pairs each rank's block attention left
unmasked (counted from its scores, probes.py), the bytes it sent,
and torch's ``context_parallel`` on the same inputs (library.attempt: on the CPU it raises,
and the line says so with the library's own message). Printed last:

    summary: worlds=2,4 cases=C library=... cp_max_abs_diff=D zigzag_work_imbalance=I
             ulysses_max_abs_diff=U allgather_max_abs_diff=G model_step_max_abs_diff=S

The other two families (family_check.py: all-gather of K/V and Ulysses, with the heads
raised to a multiple of the world size so that Ulysses can split them) run the same cases; a line per world size gives each
family's bytes per rank. D is the ring's largest |difference| over every case, rank and
tensor, U and G the same for Ulysses and all-gather (goal: <= 1e-5 in fp32 on the CPU,
parity.tolerance); I is max/min pairs per rank with zigzag, causal, over the world
sizes (goal: <= 1.05). S is a whole TransformerLM training step under CP (model_check.py: DP 1 x
CP 2 on 2 processes, DP 2 x CP 2 on 4, each attention family) against one process on the full
batch: the largest |difference| of the loss or any gradient (goal <= 1e-5 in fp32); a line per
world size also gives what each typical mistake does to the gradients. Exit status 2 and one line when a goal is missed or a flag is wrong
(--seq must be positive and a multiple of 2 x each world size).
"""
from __future__ import annotations


from source_code import processes
from source_code.cli import Parser, positive_int
from source_code.context_parallel import family_check, harness, layout as lay, library, model_check
from source_code.context_parallel.memory import cp_report
from source_code.device_policy import exact_math
from source_code.distributed import run_main
from source_code.errors import LaunchError
from source_code.parity import tolerance

IMBALANCE_GOAL = 1.05


def report(shape: harness.Shape = harness.Shape(), lengths=(), with_library: bool = True,
           verbose: bool = False) -> dict:
    """Run on every rank: parity, optionally activation bytes (``lengths``) and the library.
    ``verbose``: rank 0 prints a line as each part is done (a notebook streams them)."""
    exact_math()
    harness.say("started; ring attention vs full attention, 2 layouts x causal or not", verbose)
    out = {"parity": harness.parity(shape, verbose=verbose)}
    out["memory"] = cp_report(lengths) if lengths else None
    if lengths:
        harness.say(f"activation bytes counted for t = {', '.join(map(str, lengths))}", verbose)
    out["families"] = family_check.report(shape, verbose, lengths)
    out["model_step"] = model_check.report(verbose)
    out["library"] = library.attempt(shape) if with_library else None
    if with_library:
        harness.say("torch's context_parallel tried", verbose)
    return out


def summarize(runs: dict) -> dict:
    """{world: [each rank's report]} -> the parity table, work per rank, the two numbers."""
    rows, work, worst = [], {}, 0.0
    for world, per_rank in runs.items():
        ncases = len(per_rank[0]["parity"]["cases"])
        for i in range(ncases):
            case = per_rank[0]["parity"]["cases"][i]
            diffs = {k: max(r["parity"]["cases"][i]["diffs"][k] for r in per_rank) for k in case["diffs"]}
            worst = max(worst, *diffs.values())
            pairs = [r["parity"]["cases"][i]["unmasked"]["forward"] for r in per_rank]   # as the kernel saw them
            work[(world, case["layout"], case["causal"])] = pairs
            rows.append({"world": world, "layout": case["layout"], "causal": case["causal"], **diffs})
    fam = {f: max(row["max_diff"] for per_rank in runs.values() for r in per_rank
                  for row in r["families"]["rows"] if row["family"] == f) for f in ("ulysses", "allgather")}
    step = max(max(row["loss_diff"], row["grad_diff"]) for per_rank in runs.values() for r in per_rank
               for row in r["model_step"]["families"].values())
    zig = [lay.imbalance(w) for (world, layout, causal), w in work.items() if layout == "zigzag" and causal]
    return {"rows": rows, "work": work, "cp_max_abs_diff": worst, "zigzag_work_imbalance": max(zig),
            "ulysses_max_abs_diff": fam["ulysses"], "allgather_max_abs_diff": fam["allgather"],
            "model_step_max_abs_diff": step,
            "device": next(iter(runs.values()))[0]["parity"]["device"]}


def _worlds(text: str) -> list[int]:
    try:
        worlds = [int(w) for w in text.split(",")]
    except ValueError:
        raise LaunchError(f"error: --worlds {text!r}: comma-separated integers, e.g. 2,4") from None
    if any(w < 2 for w in worlds):
        raise LaunchError(f"error: --worlds {text!r}: context parallelism needs at least 2 processes per world")
    return worlds


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2,4", help="world sizes to run, comma-separated (default 2,4)")
    p.add_argument("--seq", type=positive_int, default=harness.Shape.seq,
                   help="sequence length, a multiple of 2 x each world size (default 48)")
    p.add_argument("--device", choices=("cpu", "auto"), default="cpu",
                   help="cpu: gloo on the CPU; auto: one GPU per process where there are enough")
    args = p.parse_args(argv)
    worlds = _worlds(args.worlds)
    for world in worlds:  # a length that does not divide: one line, before any process starts
        try:
            lay.check_length(args.seq, world, "zigzag")
        except ValueError as exc:
            raise LaunchError(f"error: --seq: {exc}") from None
    shape = harness.Shape(seq=args.seq)
    runs = {w: processes.spawn(report, w, shape, (), w == worlds[0], device=args.device, stream=False)
            for w in worlds}
    s = summarize(runs)
    tol, why = tolerance(s["device"])
    for row in s["rows"]:
        print(f"{row['world']} ranks {row['layout']:10s} causal={row['causal']!s:5s} max |diff| "
              + " ".join(f"{k} {row[k]:.1e}" for k in ("out", "dq", "dk", "dv")))
    for (world, layout, causal), pairs in s["work"].items():
        if causal:
            print(f"pairs per rank, {world} ranks, {layout}, causal: {pairs} (max/min {lay.imbalance(pairs):.2f})")
    for world, per_rank in runs.items():
        sent = {row["family"]: row["sent"]["forward"] + row["sent"]["backward"]
                for row in per_rank[0]["families"]["rows"]}
        print(f"bytes per rank and layer, {world} ranks, fp32: " +
              ", ".join(f"{f} {sent[f]:.0f}" for f in ("ring", "allgather", "ulysses")))
    for world, per_rank in runs.items():
        m = per_rank[0]["model_step"]
        bad = {k: max(r["model_step"]["mistakes"][k]["grad_diff"] for r in per_rank) for k in m["mistakes"]}
        print(f"model step, DP {m['dp']} x CP {m['cp']}, {m['batch']} x {m['seq']} tokens: largest |gradient| "
              f"{m['ref_grad_max']:.2e}; |gradient difference| with " + ", ".join(f"{k} {v:.1e}" for k, v in bad.items()))
    lib = runs[worlds[0]][0]["library"]
    if lib["ran"]:
        lib_word = "ran"
        print(f"torch context_parallel on {lib['device']}: vs full {lib['vs_full']:.1e}, vs ours "
              f"{lib['vs_ours']:.1e}, collectives {lib['comm']}")
    else:
        lib_word = f"failed-on-{lib['device']}"
        print(f"torch context_parallel on {lib['device']} (torch {lib['torch']}): {lib['error']}")
    print(why)
    d, i = s["cp_max_abs_diff"], s["zigzag_work_imbalance"]
    u, g, m = s["ulysses_max_abs_diff"], s["allgather_max_abs_diff"], s["model_step_max_abs_diff"]
    print(f"summary: worlds={','.join(map(str, worlds))} cases={len(s['rows'])} library={lib_word} "
          f"cp_max_abs_diff={d:.3e} zigzag_work_imbalance={i:.3f} ulysses_max_abs_diff={u:.3e} "
          f"allgather_max_abs_diff={g:.3e} model_step_max_abs_diff={m:.3e}")
    if lib["ran"] and max(lib["vs_full"], lib["vs_ours"]) > tol:
        raise LaunchError(f"error: torch's context_parallel differs by {max(lib['vs_full'], lib['vs_ours']):.2e} > {tol:g}")
    if max(d, u, g, m) > tol or i > IMBALANCE_GOAL:
        raise LaunchError(f"error: goal missed: cp_max_abs_diff {d:.2e}, ulysses_max_abs_diff {u:.2e}, "
                          f"allgather_max_abs_diff {g:.2e}, model_step_max_abs_diff {m:.2e} (each <= {tol:g}), "
                          f"zigzag_work_imbalance {i:.3f} (<= {IMBALANCE_GOAL})")
    return 0


if __name__ == "__main__":
    run_main(main)
