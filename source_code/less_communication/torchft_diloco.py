"""torchft's DiLoCo and LocalSGD beside ours: the same model, batches, H and optimizers, two replica groups.

    python -m source_code.less_communication.torchft_diloco
    python -m source_code.less_communication.torchft_diloco --steps 80 --every 20

torchft (Meta's fault-tolerance library) ships ``torchft.local_sgd.DiLoCo``: a context manager
that hooks the inner optimizer's ``step`` and, every ``sync_every`` steps, all-reduces the
pseudo-gradients through its ``Manager`` (quorum via a lighthouse server, a gloo group of the
replicas that are alive) and steps the outer optimizer. Here two replica groups of one worker
each run as two threads of this process, as torchft's own integration tests do, with a
lighthouse on a free port. Each replica trains the notebook's TransformerLM, from the same
start (``run(start=...)``: the notebook's pretrained start), on its half of the same global
batches with the same learning rates (``harness.batch``, ``harness.set_lr``), AdamW inside and
SGD with Nesterov momentum outside (``method="local-sgd"``: torchft's LocalSGD, which averages
the parameters); ``run`` returns the replicas' mean training loss per step and held-out loss,
to compare with ``harness.train("diloco-H")`` run in a process group.
torchft is optional: without it ``available()`` says why.
"""
from __future__ import annotations

import contextlib
import copy
import io
import os
import tempfile
import threading
import warnings
from datetime import timedelta

import torch

from source_code import workload
from source_code.cli import Parser, positive_int
from source_code.errors import LaunchError, run_main
from source_code.less_communication import harness, tasks


def available() -> str | None:
    """None when torchft imports, else the reason."""
    try:
        import torchft.local_sgd  # noqa: F401
        from torchft._torchft import LighthouseServer  # noqa: F401
    except Exception as err:  # not installed, or built for another torch
        return f"torchft unavailable: {type(err).__name__}: {err}"
    return None


def _replica(rid: int, s: dict, lighthouse: str, out: dict, method: str, init_sync: bool,
             start: dict | None, steps: int) -> None:
    import torch.distributed as dist
    from torchft.local_sgd import DiLoCo, LocalSGD
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    dataset = tasks.train_set(s["task"], s["seed"])
    held_x, held_y = (t[rid::2] for t in tasks.held_out_set(s["task"], s["seed"]).tensors)  # as harness.train
    model = harness.build_model(s, "cpu")
    inner = torch.optim.AdamW(model.parameters(), lr=s["lr"])
    if start:
        model.load_state_dict(start["model"])
        inner.load_state_dict(copy.deepcopy(start["adamw"]))   # each replica its own copy
    first = s["pretrain"] if start else 0
    outer = torch.optim.SGD(model.parameters(), lr=s["outer_lr"], momentum=s["outer_momentum"], nesterov=True)
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=2,
                      load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
                      state_dict=lambda: {"model": model.state_dict()},
                      replica_id=f"less_communication_{rid}", store_addr="localhost",
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse,
                      timeout=timedelta(seconds=60), use_async_quorum=False,
                      init_sync=init_sync)
    losses = []
    try:
        wrapper = (DiLoCo(manager, [model], inner, outer, sync_every=s["every"], pin_memory=False)
                   if method == "diloco" else LocalSGD(manager, model, inner, sync_every=s["every"]))
        with wrapper:
            for i in range(steps):
                harness.set_lr(inner, s["lr"], first + i, first + s["steps"])
                x, y = harness.batch(dataset, first + i, s, s["seed"], rid, 2, "cpu")
                loss = workload.loss_fn(model, x, y)
                inner.zero_grad()
                loss.backward()
                inner.step()                     # every H-th step also synchronises (torchft's hook)
                losses.append(loss.item())
        with torch.no_grad():
            out[rid] = {"loss": losses, "eval": workload.loss_fn(model, held_x, held_y).item()}
    except Exception as err:
        out[rid] = {"error": f"{type(err).__name__}: {err}"}
    finally:
        manager.shutdown(wait=False)


@contextlib.contextmanager
def _stderr_fd_to(sink: io.StringIO):
    """File descriptor 2 (C++ and Rust warnings) into ``sink`` for the block."""
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.write(tmp.read())


def run(settings: dict | None = None, method: str = "diloco", init_sync: bool = False,
        start: dict | None = None, steps: int | None = None) -> dict:
    """Two replicas of torchft's DiLoCo (or LocalSGD) for ``steps`` steps (default
    settings["steps"]) from ``start`` (``harness.pretrain``'s state; None: the initial model),
    with harness.train's batches and learning rates; {"loss": mean per step, "eval": mean
    held-out loss}. ``init_sync=False``: both replicas start from the same state, so no replica
    is healed from the other's state at the first quorum (torchft's default would, and the
    first quorum forms at the first synchronisation: one replica's steps would be lost)."""
    if method not in ("diloco", "local-sgd"):
        raise ValueError(f"method must be diloco or local-sgd, got {method!r}")
    os.environ.setdefault("RUST_LOG", "error")     # torchft's quorum log, before it starts
    from torchft._torchft import LighthouseServer

    s = harness.settings_with(**(settings or {}))
    torch.set_num_threads(1)
    out, chatter = {}, io.StringIO()
    # the replicas' checkpoint server logs each request and torch warns about its buffers:
    # kept out of the notebook (shown only if the run fails)
    with _stderr_fd_to(chatter), contextlib.redirect_stderr(chatter), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
        try:
            threads = [threading.Thread(target=_replica, args=(r, s, lighthouse.address(), out, method,
                                                               init_sync, start, steps or s["steps"]))
                       for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            lighthouse.shutdown()
    errors = [v["error"] for v in out.values() if "error" in v]
    if errors:
        raise RuntimeError(f"torchft DiLoCo failed: {errors[0]}\n{chatter.getvalue()[-2000:]}")
    return {"loss": [(a + b) / 2 for a, b in zip(out[0]["loss"], out[1]["loss"])],
            "eval": (out[0]["eval"] + out[1]["eval"]) / 2}


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--every", type=positive_int, default=harness.DEFAULTS["every"])
    args = p.parse_args(argv)
    if args.steps % args.every:
        raise LaunchError(f"error: --steps {args.steps} is not a multiple of --every {args.every}")
    why = available()
    if why:
        raise LaunchError(f"error: {why}; install it with: pip install --no-deps torchft==0.2.0")
    r = run({"steps": args.steps, "every": args.every})
    print(f"summary: torchft DiLoCo, 2 replicas, H={args.every}, {args.steps} steps: final training "
          f"loss {r['loss'][-1]:.4f} held-out loss {r['eval']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
