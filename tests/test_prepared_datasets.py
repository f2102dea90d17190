"""Training on the prepared datasets, read offline from one read-only course directory.

The path of a cluster course: an instructor prepares MNIST, CIFAR-10 and WikiText-2 once into a
shared directory; every participant's job points WORKSHOP_DATA at it (no --data-dir), reads it
and never writes into it. The files are small and generated, in the real on-disk formats
(tests/dataset_files.py); the entry points are the real ones: their main on two forked ranks
(tests/spawned_main.py), under torchrun and as a Slurm job on the local two-node cluster. At the
end the directory is exactly as it was prepared.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import dataset_files  # noqa: E402
import spawned_main  # noqa: E402

from source_code.training.loop import parse_summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_MNIST, N_CIFAR = 64, 5 * 8


def _words(n: int) -> str:
    import numpy as np
    rng = np.random.default_rng(0)
    vocab = ["the", "game", "tower", "actor", "began", "is", "a", "of", "in", ",", "."]
    lines = [" " + " ".join(rng.choice(vocab, 12)) + " .\n" for _ in range(n)]
    return " = Heading = \n\n" + "".join(lines)


@pytest.fixture(scope="module")
def course_data(tmp_path_factory):
    """The course's shared directory, prepared once and made read-only; checked unchanged."""
    root = tmp_path_factory.mktemp("course-data")
    dataset_files.write_mnist(root, n_train=N_MNIST, n_test=32)
    _, checksums = dataset_files.write_cifar(root, n_per_batch=8, n_test=16)
    dataset_files.write_wikitext(root, {"train": _words(60), "valid": _words(12), "test": _words(12)})
    before = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}
    for p in [root, *root.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    yield root, checksums
    after = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    assert after == before, "reading wrote into the data directory"


def env_for(root: Path, checksums: dict) -> dict:
    return {"WORKSHOP_DATA": str(root), "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}",
            **dataset_files.checksums_env(checksums)}


CASES = {  # entry point and flags per dataset: a few steps each
    "mnist": ("source_code.training.ddp", ["--dataset", "mnist", "--epochs", "2"], N_MNIST),
    "cifar10": ("cifar_checksums", ["source_code.training.ddp", "--dataset", "cifar10",
                                    "--model", "resnet18", "--epochs", "1", "--batch-size", "8",
                                    "--max-steps", "2"], N_CIFAR),
    "wikitext2": ("source_code.sharding.train", ["--dataset", "wikitext2", "--epochs", "2",
                                                 "--max-steps", "3", "--batch-size", "8"], None),
}


def check_run(name: str, output: str) -> dict:
    summary = parse_summary(output)
    assert summary and summary["world_size"] == 2, output[-2000:]
    n = CASES[name][2]
    if n:  # the training set is the one in the course directory, whole
        assert f"on {name}: {n} examples" in output, output[-2000:]
    else:
        assert "wikitext2" in output, output[-2000:]
    return summary


@pytest.mark.parametrize("name", ["mnist", "wikitext2"])   # CIFAR-10: as a job, below
def test_two_ranks_train_on_the_shared_read_only_copy(course_data, monkeypatch, name):
    """The scripts' main on two forked ranks (the ranks get the environment of the call): what
    they read and train on is the point here; the launch a job makes is the CIFAR-10 job's."""
    from source_code.processes import spawn
    root, checksums = course_data
    module, args, _ = CASES[name]
    for key, value in env_for(root, checksums).items():
        monkeypatch.setenv(key, value)
    run = spawned_main.session_main if module == "source_code.sharding.train" else spawned_main.main_output
    ranks = spawn(run, 2, module, *args, device="cpu", stream=False)
    assert [code for code, _ in ranks] == [0, 0], ranks
    summary = check_run(name, ranks[0][1])
    print(f"{name}: {summary}")


@pytest.mark.slurm
@pytest.mark.parametrize("name", ["cifar10"])
def test_sbatch_trains_on_the_shared_read_only_copy(course_data, submit, name):
    """CIFAR-10 (ResNet-18) as a job: the job script starts another module than the DDP script
    (TRAIN_MODULE) on the course directory, launched as every job launches (notebook 06's
    `sbatch ... --dataset mnist` line runs in tests/test_sbatch_lines.py against the same kind of
    directory)."""
    root, checksums = course_data
    module, args, _ = CASES[name]
    job = submit("ddp_single_node.slurm", *args, env={**env_for(root, checksums), "TRAIN_MODULE": module},
                 timeout=300)
    assert job.ok, job.output[-3000:]
    check_run(name, job.output)


def test_a_job_without_the_data_names_the_prepare_command(tmp_path, torchrun):
    """The seeds' most common failure: the data was never prepared (or WORKSHOP_DATA points
    elsewhere); every rank stops at once with one line that names the command to run."""
    res = torchrun("source_code.training.ddp", "--dataset", "mnist",
                   env={"WORKSHOP_DATA": str(tmp_path / "nowhere")}, check=False, timeout=120)
    assert res.returncode != 0
    line = f"python -m source_code.data prepare --data-dir {tmp_path / 'nowhere'} --dataset mnist"
    assert line in res.stdout, res.stdout[-2000:]
    # no worker traceback through the workshop's code (torchrun's own report of the exit follows)
    assert f'File "{ROOT / "source_code"}' not in res.stdout, res.stdout[-2000:]
