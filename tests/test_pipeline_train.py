"""The pipeline training script: flags checked before the group forms, training runs, exits are clean."""
import collections
import threading

import pytest
import torch

from source_code.training import loop


@pytest.mark.parametrize("args, message", [
    (["--schedule", "naive"], "--microbatches 1"),
    (["--batch-size", "30", "--microbatches", "4"], "--batch-size 32"),
    (["--layers", "1"], "--layers 2 or more"),
    (["--schedule", "lib-interleaved-1f1b", "--layers", "3"], "--layers 4 or more"),
    (["--dim", "30"], "divisible by --heads"),
    (["--schedule", "zigzag"], "invalid choice"),
    (["--epochs", "0"], "positive integer"),
])
def test_bad_flags_fail_in_one_line(args, message, monkeypatch, capsys):
    from source_code.pipeline import train
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exc:
        train.main(args)
    assert exc.value.code == 2 and message in str(exc.value)


def _main_in_spawned_group(*argv):
    """The script's main in a rank of processes.spawn: its session is the group spawn formed,
    seeded as the script's own session seeds it."""
    import contextlib
    from source_code import distributed
    from source_code.pipeline import train

    @contextlib.contextmanager
    def session(launch_hint=None, seed=None):
        ctx = distributed.context()
        if seed is not None:
            distributed.seed_everything(seed, ctx.rank)
        yield ctx
    train.session = session
    return train.main(list(argv))


@pytest.mark.parity
def test_own_and_library_schedules_train_the_same_and_exit_cleanly(torchrun, capfd):
    """Own and library schedules train the same, step for step: the library's 1F1B launched under
    torchrun (it exits 0 and cleanly; notebook 10 launches the script again, with its own 1F1B),
    our GPipe and 1F1B on forked ranks (what they add is their schedule, not another launch)."""
    flags = ("--epochs", "1", "--max-steps", "12", "--eval-samples", "64")
    outputs = {"lib-1f1b": torchrun("source_code.pipeline.train", "--schedule", "lib-1f1b", *flags, nproc=2).stdout}
    from source_code.processes import spawn
    for schedule in ("gpipe", "1f1b"):
        capfd.readouterr()
        assert spawn(_main_in_spawned_group, 2, "--schedule", schedule, *flags, stream=True) == [0, 0]
        outputs[schedule] = capfd.readouterr().out
    losses = {}
    for schedule, out in outputs.items():
        assert "terminate called" not in out
        summary = loop.parse_summary(out)
        assert summary["world_size"] == 2 and summary["accuracy"] > 0.1
        losses[schedule] = [ln.split("loss ")[1].split()[0] for ln in out.splitlines()
                            if ln.startswith("epoch")]
    assert len(losses["gpipe"]) == 1
    assert losses["gpipe"] == losses["1f1b"] == losses["lib-1f1b"]  # the same training, step for step


class Unbuffered:
    """Messages between threads that a send hands over only to a receive already waiting for it:
    NCCL's behaviour once an activation exceeds its buffers. A deadlock is every rank still
    running waiting at once, none of them able to go on: no other rank is left to make the
    handover one waits for. Decided from who waits for what, not from a clock."""

    def __init__(self, ranks):
        self.cond = threading.Condition()
        self.boxes = collections.defaultdict(collections.deque)  # (src, dst) -> [tensor, taken]
        self.live, self.waiting, self.deadlock = ranks, {}, False

    def _wait(self, rank, ready, message):
        """Block (the lock held) until ``ready()``; a deadlock raises TimeoutError(message)."""
        self.waiting[rank] = ready
        try:
            while not ready():
                stuck = len(self.waiting) == self.live and not any(f() for f in self.waiting.values())
                if self.deadlock or stuck:
                    self.deadlock = True
                    self.cond.notify_all()
                    raise TimeoutError(message)
                self.cond.wait()
        finally:
            del self.waiting[rank]

    def finished(self):
        with self.cond:
            self.live -= 1
            self.cond.notify_all()

    def link(self, rank, stage, n_stages, p):
        net = self

        class Link:
            prev, next = (stage - 1) % p, (stage + 1) % p

            def exchange(self, send=None, recv=None):
                with net.cond:
                    if send is not None:
                        item = [send[0], False]
                        net.boxes[rank, self.next].append(item)
                        net.cond.notify_all()
                        net._wait(rank, lambda: item[1], f"rank {rank} (stage {stage}): its send was never received")
                    if recv is not None:
                        box = net.boxes[self.prev, rank]
                        net._wait(rank, lambda: bool(box), f"rank {rank} (stage {stage}): nothing to receive")
                        item = box.popleft()
                        item[1] = True
                        net.cond.notify_all()
                        return item[0]

            def flush(self):
                pass
        return Link()


def stage_by_stage(mods, ids, links, n_stages, xs, shape, count):
    """The earlier order: every microbatch through one local stage, then through the next."""
    from source_code.pipeline.train import forward_only
    out = []
    for mod, s, link in zip(mods, ids, links):
        out += forward_only([mod], [s], [link], n_stages, xs, shape, count)
    return out


def run_ranks(forward, p, per_rank, m):
    """``forward`` on p threads, one per rank, rank r holding stages r, r + p, ... (looped)."""
    n = p * per_rank
    net, results, errors = Unbuffered(p), {}, {}
    xs = [torch.full((2, 3), float(i)) for i in range(m)]

    def rank_main(r):
        ids = list(range(r, n, p))
        mods = [lambda h, s=s: 2 * h + s for s in ids]            # stage s: h -> 2h + s
        try:
            results[r] = forward(mods, ids, [net.link(r, s, n, p) for s in ids], n, xs, (2, 3),
                                 lambda out, i: out)
        except TimeoutError as err:
            errors[r] = str(err)
        finally:
            net.finished()
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors, xs


@pytest.mark.parametrize("p, per_rank, m", [(2, 2, 4), (3, 2, 3), (2, 1, 4)])
def test_forward_only_needs_no_buffering_in_looped_layouts(p, per_rank, m):
    from source_code.pipeline.train import forward_only
    results, errors, xs = run_ranks(forward_only, p, per_rank, m)
    assert not errors
    want = []
    for x in xs:
        for s in range(p * per_rank):
            x = 2 * x + s
        want.append(x)
    assert all(torch.equal(a, b) for a, b in zip(results[(p * per_rank - 1) % p], want))


def test_stage_by_stage_deadlocks_without_buffering():
    """The order forward_only replaced, in the same harness: the looped layout's last rank and
    rank 0 each wait for the other (the harness can see the bug the test above guards against)."""
    _, errors, _ = run_ranks(stage_by_stage, 2, 2, 2)
    assert errors and all("never received" in e or "nothing to receive" in e for e in errors.values())
