"""Snapshots: atomic writes under a crash, refusal of foreign files, exact resume of the DDP job."""
import io
import os
import time

import pytest
import torch

from source_code import checkpoint, models
from source_code.checkpoint import CheckpointMismatch
from source_code.distributed import run_main

import spawned_main  # tests/: an entry point's main in a rank of processes.spawn


def temp_files(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.fault
def test_crash_while_writing_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    path = tmp_path / "snap.pt"
    checkpoint.atomic_save({"version": 1, "weights": torch.full((100_000,), 1.0)}, path)
    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):  # a full disk or a crash in the middle
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        assert temp_files(tmp_path), "the half-written data must go to a temporary file"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.atomic_save({"version": 2, "weights": torch.full((100_000,), 2.0)}, path)
    monkeypatch.undo()
    old = torch.load(path, weights_only=True)
    assert old["version"] == 1 and torch.equal(old["weights"], torch.full((100_000,), 1.0))
    assert temp_files(tmp_path) == []  # nothing left behind


@pytest.mark.fault
def test_next_save_removes_what_a_killed_writer_left(tmp_path, monkeypatch):
    path = tmp_path / "snap.pt"
    stale = tmp_path / "snap.pt.k1ll3d.tmp"  # SIGKILL mid-write: no handler could remove it
    stale.write_bytes(b"\0" * 1000)
    os.utime(stale, (time.time() - 60, time.time() - 60))
    live = tmp_path / "snap.pt.l1v3.tmp"  # touched after our write began: not ours to delete
    other = tmp_path / "other.pt.x.tmp"   # another snapshot's temporary file
    other.write_bytes(b"")
    os.utime(other, (time.time() - 60, time.time() - 60))
    real_save = torch.save

    def save_while_another_writes(obj, f, *args, **kwargs):
        live.write_bytes(b"\0")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_while_another_writes)
    checkpoint.atomic_save({"version": 3}, path)
    monkeypatch.undo()
    assert torch.load(path)["version"] == 3
    assert temp_files(tmp_path) == ["other.pt.x.tmp", "snap.pt.l1v3.tmp"]


def snapshot_of(model, path, epoch=1):
    """One SGD step with momentum on ``model`` (a SmallCNN), then a snapshot of it."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, model.features[0].in_channels, 8, 8)).sum().backward()
    opt.step()
    checkpoint.save_snapshot(path, model, opt, epoch)
    return opt


def test_round_trip_restores_weights_momentum_epoch_and_rng(tmp_path):
    torch.manual_seed(0)
    model = models.SmallCNN()
    opt = snapshot_of(model, tmp_path / "s.pt", epoch=3)
    expected_next_random = torch.rand(3)  # what the RNG draws right after the save
    torch.manual_seed(123)
    fresh = models.SmallCNN()
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    snap = checkpoint.load_snapshot(tmp_path / "s.pt", fresh, fresh_opt)
    assert snap["epoch"] == 3
    assert torch.equal(torch.rand(3), expected_next_random)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
        assert torch.equal(opt.state[a]["momentum_buffer"], fresh_opt.state[b]["momentum_buffer"])


def one_line(err) -> str:
    message = str(err)
    assert "\n" not in message and message.startswith("error: ")
    assert err.code == 2
    return message


def test_snapshot_of_another_model_is_refused_with_the_fix(tmp_path):
    torch.manual_seed(0)
    snapshot_of(models.SmallCNN(in_channels=1), tmp_path / "digits.pt")
    with pytest.raises(CheckpointMismatch) as err:  # same class, other shapes (CIFAR's 3 channels)
        checkpoint.load_snapshot(tmp_path / "digits.pt", models.SmallCNN(in_channels=3))
    message = one_line(err.value)
    assert "first difference: ('features.0.weight'" in message
    assert "use a new --checkpoint path" in message
    with pytest.raises(CheckpointMismatch) as err:  # another class altogether
        checkpoint.load_snapshot(tmp_path / "digits.pt", models.TransformerLM())
    assert "holds a SmallCNN but this run builds a TransformerLM" in one_line(err.value)


def test_files_that_are_not_snapshots_are_refused(tmp_path):
    model = models.SmallCNN()
    torch.save(model.state_dict(), tmp_path / "weights.pt")  # plain weights, no training state
    (tmp_path / "garbage.pt").write_bytes(b"not a pickle at all")
    cases = {"weights.pt": "is not a training snapshot of this workshop",
             "garbage.pt": "is not a readable snapshot",
             "absent.pt": "start without --resume"}
    for name, expected in cases.items():
        with pytest.raises(CheckpointMismatch) as err:
            checkpoint.load_snapshot(tmp_path / name, model)
        assert expected in one_line(err.value), name


def test_show_command_prints_the_refusal_as_one_line(tmp_path, capsys):
    (tmp_path / "garbage.pt").write_bytes(b"\x80\x04junk")
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: checkpoint.main(["show", str(tmp_path / "garbage.pt")]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a readable snapshot" in err


@pytest.mark.parity
def test_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, capfd):
    """2 epochs straight vs 1 epoch, stop, resume for the 2nd: same weights and momentum."""
    from source_code.processes import spawn
    common = ["--max-steps", "6", "--batch-size", "32"]
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    for epochs, path in ((2, a), (1, b)):
        spawn(spawned_main.ddp_main, 2, "--epochs", str(epochs), "--checkpoint", str(path), *common, stream=True)
    assert torch.load(b, weights_only=False)["epoch"] == 1
    capfd.readouterr()
    spawn(spawned_main.ddp_main, 2, "--epochs", "2", "--checkpoint", str(b), "--resume", *common, stream=True)
    out = capfd.readouterr().out
    assert "resumed from" in out and "after epoch 1" in out
    straight, resumed = (torch.load(p, weights_only=False) for p in (a, b))
    assert straight["epoch"] == resumed["epoch"] == 2
    assert straight["model"].keys() == resumed["model"].keys()
    for k in straight["model"]:
        assert torch.equal(straight["model"][k], resumed["model"][k]), k
    sa, sb = straight["optimizer"]["state"], resumed["optimizer"]["state"]
    assert sa.keys() == sb.keys() and len(sa) == len(straight["model"])
    for i in sa:
        assert torch.equal(sa[i]["momentum_buffer"], sb[i]["momentum_buffer"]), i
    # and the run did train: the weights moved away from the seeded initialisation
    torch.manual_seed(0)
    init = models.SmallCNN().state_dict()
    assert not torch.equal(init["features.0.weight"], straight["model"]["features.0.weight"])


def test_a_cpu_rank_on_a_gpu_machine_never_touches_cuda(monkeypatch):
    """A rank that fell back to the CPU (4 processes, 1 GPU) must not create a CUDA context on
    GPU 0 just to save its random state: only a process that initialised CUDA reads it."""
    import torch
    from source_code import checkpoint

    def touched(*args, **kwargs):
        raise AssertionError("CUDA was touched by a CPU rank")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state", touched)
    monkeypatch.setattr(torch.cuda, "set_rng_state", touched)
    state = checkpoint.rng_state()
    assert state["cuda"] is None
    checkpoint.set_rng_state({**state, "cuda": torch.zeros(8, dtype=torch.uint8)})


def test_a_new_loader_iterator_takes_one_draw_of_the_global_stream_unless_it_has_its_own():
    """Notebook 07's note on resuming inside an epoch: the draw for the workers' base seed comes
    from the global generator when the loader has no generator of its own."""
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.arange(8.0))
    torch.manual_seed(0)
    untouched = torch.rand(1)
    torch.manual_seed(0)
    torch.empty((), dtype=torch.int64).random_()
    after_one_draw = torch.rand(1)
    torch.manual_seed(0)
    iter(DataLoader(data, batch_size=2))
    assert torch.equal(torch.rand(1), after_one_draw) and not torch.equal(after_one_draw, untouched)
    torch.manual_seed(0)
    iter(DataLoader(data, batch_size=2, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(torch.rand(1), untouched)
