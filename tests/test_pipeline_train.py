"""The pipeline training script: flags checked before the group forms, training runs, exits are clean."""
import pytest

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


@pytest.mark.parity
def test_repeated_launches_train_and_exit_cleanly(torchrun):
    """A few launches (own and library schedules): all exit 0, same losses for equal schedules."""
    losses = {}
    for schedule in ("gpipe", "1f1b", "lib-1f1b"):
        res = torchrun("source_code.pipeline.train", "--schedule", schedule, "--epochs", "1",
                       "--max-steps", "12", "--eval-samples", "64", nproc=2)
        assert "terminate called" not in res.stdout
        summary = loop.parse_summary(res.stdout)
        assert summary["world_size"] == 2 and summary["accuracy"] > 0.1
        losses[schedule] = [ln.split("loss ")[1].split()[0] for ln in res.stdout.splitlines()
                            if ln.startswith("epoch")]
    assert losses["gpipe"] == losses["1f1b"] == losses["lib-1f1b"]  # the same training, step for step
