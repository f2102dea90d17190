"""The flight recorder: every rank's last collectives, dumped when something goes wrong.

With ``TORCH_FR_BUFFER_SIZE=N`` set before the process group starts, each process keeps a ring
buffer of its last N collectives (name, sizes, sequence number, state). After a timeout every
rank dumps its buffer; laid side by side, the first sequence number where the ranks disagree
names the collective one rank never made. On NCCL the entries also carry start and completion
times, and ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` makes the watchdog write the dump by itself (files
``$TORCH_FR_DUMP_TEMP_FILE<rank>``; ``python -m torch.distributed.flight_recorder.fr_trace``
analyses them). The gloo recorder (torch >= 2.8) has no completion times.

The two backends keep separate recorders, each with its own sequence numbers: in the mixed
group ``cpu:gloo,cuda:nccl`` of a GPU node the collectives on CPU tensors are in gloo's, those
on CUDA tensors in NCCL's. ``dump()`` reads gloo's (the hang drill runs on gloo, see
``hang.py``); ``dump("nccl")`` reads NCCL's.
"""
from __future__ import annotations

import json

import torch


RECORDERS = {"gloo": "_dump_fr_trace_json", "nccl": "_dump_nccl_trace_json"}


def dump(backend: str = "gloo") -> dict | None:
    """This process's entries in ``backend``'s flight recorder as a dict, or None where this
    torch has no such recorder."""
    import torch._C._distributed_c10d as c10d
    fn = getattr(c10d, RECORDERS[backend], None)
    if fn is None:
        return None
    try:
        return json.loads(fn(True, False))
    except Exception:  # an older build without the recorder for this backend
        return None


def unavailable_reason() -> str:
    from source_code import torch_versions
    if not torch_versions.supported("flight-recorder", "cpu"):
        return torch_versions.refusal("flight-recorder").removeprefix("error: ")
    return (f"torch {torch.__version__} has no flight recorder for this backend (NCCL: "
            "TORCH_NCCL_TRACE_BUFFER_SIZE on older versions)")


def collectives(fr: dict) -> list[dict]:
    """The default group's entries, in the order they were issued."""
    entries = [e for e in (fr or {}).get("entries", [])
               if e.get("pg_id") == 0 or "default_pg" in (e.get("process_group") or [])]
    return sorted(entries, key=lambda e: e.get("collective_seq_id", 0))


def describe(e: dict | None) -> str:
    if e is None:
        return "nothing (never issued it)"
    sizes = ", ".join("x".join(map(str, s)) or "scalar" for s in e.get("input_sizes", [])) or "no tensor"
    dtypes = ",".join(e.get("input_dtypes", []))
    return f"#{e.get('collective_seq_id')} {e.get('profiling_name')} [{sizes}] {dtypes}".rstrip()


def first_mismatch(dumps: dict[int, dict]) -> dict | None:
    """Compare the ranks' recorders; the first position where their collectives differ.

    Returns {"index": i, "per_rank": {rank: description}} or None when all ranks agree.
    """
    lists = {r: collectives(fr) for r, fr in dumps.items()}
    longest = max((len(v) for v in lists.values()), default=0)
    key = lambda e: None if e is None else (e.get("profiling_name"), e.get("input_sizes"))
    for i in range(longest):
        at = {r: (v[i] if i < len(v) else None) for r, v in lists.items()}
        if len({json.dumps(key(e)) for e in at.values()}) > 1:
            return {"index": i + 1, "per_rank": {r: describe(e) for r, e in sorted(at.items())}}
    return None


def report(dumps: dict[int, dict]) -> str:
    """A few lines: each rank's collective count and last entry, then the first mismatch."""
    lines = []
    for r, fr in sorted(dumps.items()):
        cs = collectives(fr)
        lines.append(f"  rank {r}: {len(cs)} collectives recorded, last {describe(cs[-1] if cs else None)}")
    mm = first_mismatch(dumps)
    if mm is None:
        lines.append("  the ranks' recorders agree: look for a rank that is slow or stuck outside collectives")
    else:
        lines.append(f"  first mismatch at collective {mm['index']}: " +
                     "; ".join(f"rank {r} ran {d}" for r, d in mm["per_rank"].items()))
    return "\n".join(lines)
