"""The tensor-parallel training script: flags checked before the group forms, one launch trains."""
import pytest

from source_code.training import loop


@pytest.mark.parametrize("args, message", [
    (["--heads", "3", "--dim", "48"], "do not split over 2 processes"),
    (["--dim", "30"], "divisible by --heads"),
    (["--impl", "megatron"], "invalid choice"),
    (["--samples", "8"], "--batch-size"),
    (["--epochs", "0"], "positive integer"),
])
def test_bad_flags_fail_in_one_line(args, message, monkeypatch):
    from source_code.tensor_parallel import train
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exc:
        train.main(args)
    assert exc.value.code == 2 and message in str(exc.value)


@pytest.mark.parity
def test_one_launch_trains_and_exits_cleanly(torchrun):
    res = torchrun("source_code.tensor_parallel.train", "--impl", "own", "--epochs", "1",
                   "--max-steps", "24", "--eval-samples", "64", nproc=2)
    assert "terminate called" not in res.stdout
    summary = loop.parse_summary(res.stdout)
    assert summary["world_size"] == 2 and summary["accuracy"] > 0.3
    assert sum(ln.startswith("epoch") for ln in res.stdout.splitlines()) == 1   # rank 0 prints alone
