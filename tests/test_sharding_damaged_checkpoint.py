"""A damaged sharded checkpoint on --resume: one line naming the fix, exit status 2, files kept.

    python -m pytest tests/test_sharding_damaged_checkpoint.py
"""
import shutil
import sys
from pathlib import Path

import pytest

from source_code.checkpoint import CheckpointMismatch
from source_code.sharding import checkpointing

sys.path.insert(0, str(Path(__file__).parent))
import spawned_main  # noqa: E402  tests/: an entry point's main in a rank of processes.spawn

TRAIN = "source_code.sharding.train"
TINY = ["--dim", "16", "--layers", "1", "--heads", "2", "--max-steps", "1"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 2-rank checkpoint of one step (written once for the module, by the script's main on
    forked ranks; the resumes below run under torchrun)."""
    from source_code.processes import spawn
    ck = tmp_path_factory.mktemp("dcp") / "ck"
    ranks = spawn(spawned_main.session_main, 2, TRAIN, *TINY, "--epochs", 1, "--checkpoint", ck, stream=False)
    assert [code for code, _ in ranks] == [0, 0], ranks
    assert checkpointing.verify(ck) == checkpointing.latest(ck)   # intact: no complaint
    return ck


def _copy(saved, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    return ck, checkpointing.latest(ck)


def _truncate(path, keep=1000):
    with open(path, "r+b") as f:
        f.truncate(keep)


def _damage(how, step):
    import os
    files = sorted(f for f in os.listdir(step) if f.endswith(".distcp"))
    if how == "metadata missing":
        os.remove(os.path.join(step, ".metadata"))
    elif how == "metadata unreadable":
        _truncate(os.path.join(step, ".metadata"), 10)
    elif how == "distcp missing":
        os.remove(os.path.join(step, files[-1]))
    elif how == "distcp truncated":
        _truncate(os.path.join(step, files[-1]))
    elif how == "distcp corrupt":            # right length, wrong bytes: only loading finds it
        with open(os.path.join(step, files[-1]), "r+b") as f:
            size = f.seek(0, 2)
            f.seek(100)
            f.write(bytes(size - 200))


@pytest.mark.parametrize("how,says", [
    ("metadata missing", ".metadata is missing"),
    ("metadata unreadable", ".metadata is unreadable"),
    ("distcp missing", "__1_0.distcp is missing"),
    ("distcp truncated", "__1_0.distcp holds 1,000 of the"),
])
def test_verify_names_the_damage_before_loading(saved, tmp_path, how, says):
    ck, step = _copy(saved, tmp_path)
    _damage(how, step)
    with pytest.raises(CheckpointMismatch, match="damaged") as err:
        checkpointing.verify(ck)
    assert says in str(err.value) and "without --resume" in str(err.value)
    assert err.value.code == 2


@pytest.mark.parametrize("how,says", [
    ("distcp truncated", "truncated"),                      # found before the group forms
    ("distcp corrupt", "loading failed: UnpicklingError"),  # found by DCP while loading
])
def test_resume_from_damaged_checkpoint_prints_one_line(saved, tmp_path, torchrun, how, says):
    ck, step = _copy(saved, tmp_path)
    _damage(how, step)
    import os
    before = sorted(os.listdir(step))
    res = torchrun(TRAIN, *TINY, "--epochs", 2, "--checkpoint", ck, "--resume", nproc=2, check=False)
    assert res.returncode != 0
    errors = [ln for ln in res.stdout.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and says in errors[0] and "damaged" in errors[0], res.stdout[-3000:]
    assert "[rank0]" not in res.stdout and "[rank1]" not in res.stdout   # no rank's traceback
    assert "exitcode  : 2" in res.stdout                                 # LaunchError's status
    assert sorted(os.listdir(step)) == before                            # nothing removed
