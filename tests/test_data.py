"""Datasets: the embedded ones, and the real ones read from files in their on-disk formats.

The MNIST, CIFAR-10 and WikiText-2 files are written here, small, in the exact formats the
download produces (IDX, pickled CIFAR batches, raw text), so the offline reading path of
source_code.data is exercised end to end without network.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import dataset_files  # noqa: E402

from source_code import data  # noqa: E402
from source_code.errors import run_main  # noqa: E402


# ---------------------------------------------------------------- embedded and generated
def test_digits_split_is_fixed_disjoint_and_complete():
    train, test = data.digits("train"), data.digits("test")
    assert (len(train), len(test)) == (1438, 359)  # 1797 images, 20 % held out
    assert train.tensors[0].shape[1:] == (1, 8, 8) and train.tensors[0].dtype == torch.float32
    assert train.tensors[1].dtype == torch.int64 and set(train.tensors[1].tolist()) == set(range(10))
    assert 0 <= train.tensors[0].min() and train.tensors[0].max() <= 1
    again = data.digits("train")
    assert torch.equal(train.tensors[0], again.tensors[0])  # same split every call (every rank)
    # a partition: train + held-out together are exactly the 1797 images (with labels), once each
    from sklearn.datasets import load_digits
    full = load_digits()

    def rows(x, y):
        return sorted(tuple(r) + (int(t),) for r, t in zip(x.flatten(1).tolist(), y.tolist()))
    assert rows(torch.cat([train.tensors[0], test.tensors[0]]) * 16,
                torch.cat([train.tensors[1], test.tensors[1]])) == rows(
        torch.tensor(full.images, dtype=torch.float32), torch.tensor(full.target))


def test_sort_task_targets_are_inputs_shifted_with_ignored_prompt():
    x, y = data.load("sort", "train").tensors
    n, length = x.shape
    assert (n, length) == (2048, 32) and x.dtype == y.dtype == torch.int64
    assert (y[:, :16] == -100).all()                  # the unsorted prompt is not scored
    assert torch.equal(y[:, 16:-1], x[:, 17:])        # target = next input token
    assert (x[:, 16] == 16).all()                     # separator token
    assert torch.equal(y[:, 16:], x[:, :16].sort(dim=1).values)  # answer = the sorted prompt
    x_copy, y_copy = data.load("copy", "train").tensors
    assert torch.equal(y_copy[:, 16:], x_copy[:, :16])
    assert not torch.equal(data.load("sort", "test").tensors[0], x)  # other seed for test


def test_unknown_dataset_names_the_choices():
    with pytest.raises(SystemExit, match="choose one of digits, sort, copy, mnist"):
        data.load("imagenet")


# ---------------------------------------------------------------- MNIST (IDX files)
@pytest.fixture
def mnist_dir(tmp_path):
    return tmp_path, dataset_files.write_mnist(tmp_path)


def test_mnist_reads_idx_files_pixel_exact(mnist_dir):
    root, truth = mnist_dir
    for split, (images, labels) in truth.items():
        ds = data.load("mnist", split, root)
        assert len(ds) == len(labels)
        x, y = ds[1]
        assert x.shape == (1, 28, 28) and x.dtype == torch.float32
        assert y.dtype == torch.int64 and int(y) == labels[1]
        assert torch.equal(ds.unnormalize(x)[0], torch.from_numpy(images[1]))
        xs = torch.stack([ds[i][0] for i in range(len(ds))])
        assert torch.equal(ds.unnormalize(xs)[:, 0], torch.from_numpy(images))
        assert [int(ds[i][1]) for i in range(len(ds))] == labels.tolist()
    # normalised with MNIST's mean and std: pixel p becomes (p / 255 - 0.1307) / 0.3081
    expected = (torch.from_numpy(images[1]).float() / 255 - 0.1307) / 0.3081
    assert torch.allclose(ds[1][0][0], expected, atol=1e-6)


def test_missing_mnist_is_one_line_with_the_prepare_command(tmp_path, capsys):
    # `python -m source_code.data show ...` is run_main(main): here, without a new interpreter
    empty = tmp_path / "empty"
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: data.main(["show", "--dataset", "mnist", "--data-dir", str(empty)]))
    said = capsys.readouterr()
    assert exit_.value.code == 2, said.err
    assert said.out == "" and said.err.count("\n") == 1
    assert f"python -m source_code.data prepare --data-dir {empty} --dataset mnist" in said.err


# ---------------------------------------------------------------- CIFAR-10 (pickled batches)
@pytest.fixture
def cifar_dir(tmp_path, monkeypatch):
    truth, checksums = dataset_files.write_cifar(tmp_path)
    # torchvision verifies the md5 of each file against the real download's: point it at ours
    dataset_files.use_checksums(checksums, monkeypatch.setattr)
    return tmp_path, truth


def test_cifar10_reads_pickled_batches_pixel_exact(cifar_dir):
    root, truth = cifar_dir
    for split, (images, labels) in truth.items():
        ds = data.load("cifar10", split, root)
        assert len(ds) == len(labels) == (15 if split == "train" else 4)
        xs = torch.stack([ds[i][0] for i in range(len(ds))])
        assert xs.shape == (len(ds), 3, 32, 32) and xs.dtype == torch.float32
        ys = torch.stack([ds[i][1] for i in range(len(ds))])
        assert ys.dtype == torch.int64 and ys.tolist() == labels
        # the file stores each image as 3 planes of 32x32 (channel-first): compare as such
        assert torch.equal(ds.unnormalize(xs), torch.from_numpy(images.reshape(-1, 3, 32, 32)))
    assert data.in_channels("cifar10") == 3 and data.in_channels("mnist") == 1


def test_corrupted_cifar_is_missing_data(cifar_dir):
    root, _ = cifar_dir
    with open(root / "cifar-10-batches-py" / "test_batch", "ab") as f:
        f.write(b"x")  # md5 no longer matches
    with pytest.raises(data.MissingData, match="--dataset cifar10") as err:
        data.load("cifar10", "test", root)
    assert err.value.code == 2


# ---------------------------------------------------------------- WikiText-2 (raw text)
WIKI = dataset_files.WIKI


@pytest.fixture
def wiki_dir(tmp_path):
    dataset_files.write_wikitext(tmp_path)
    data.char_vocab.cache_clear()
    return tmp_path


def test_wikitext2_blocks_are_next_character_pairs(wiki_dir):
    ds = data.wikitext2("train", wiki_dir, block_len=16)
    x, y = ds.tensors
    n = (len(WIKI["train"]) - 1) // 16
    assert x.shape == y.shape == (n, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x[1:, 0], y[:-1, -1])
    assert ds.decode(x.flatten()) == WIKI["train"][: n * 16]  # lossless on the training text
    # vocabulary: unknown + each distinct training character, most frequent first
    assert len(ds.vocab) == 1 + len(set(WIKI["train"])) and ds.vocab[1] == " "
    valid = data.load("wikitext2", "valid", wiki_dir)  # default block length 64 fits
    assert valid.tensors[0].shape[1] == 64
    ids = data.encode("Ω", ds.vocab)
    assert ids.tolist() == [0]  # a character never seen in training is "unknown"
    test = data.wikitext2("test", wiki_dir, block_len=8)
    seen = set(WIKI["train"])  # "R" never occurs in the training text: it decodes as unknown
    assert test.decode(test.tensors[0][0]) == "".join(
        c if c in seen else "\N{REPLACEMENT CHARACTER}" for c in WIKI["test"][:8])
    assert len(data.char_vocab(str(wiki_dir), 4)) == 4  # capped vocabulary


def test_missing_wikitext_names_the_prepare_command(tmp_path):
    with pytest.raises(data.MissingData, match="prepare --data-dir .* --dataset wikitext2"):
        data.load("wikitext2", "train", tmp_path)


def test_prepared_wikitext_reads_back_line_for_line(tmp_path, monkeypatch):
    """`prepare` writes the Hub's rows (one line each, newline included) as the raw files."""
    import datasets
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    rows = {"train": [" = A = \n", "", " b c a .\n"], "validation": [" a b \n"], "test": [" c \n"]}
    real_load = datasets.load_dataset

    caches = []

    def hub(path, *args, **kwargs):  # stands in for the download; everything else is real
        if path != "Salesforce/wikitext":
            return real_load(path, *args, **kwargs)
        assert args == ("wikitext-2-raw-v1",)
        caches.append((kwargs.get("cache_dir"), os.environ.get("HF_HOME")))
        return {split: {"text": lines} for split, lines in rows.items()}

    monkeypatch.setattr(datasets, "load_dataset", hub)
    monkeypatch.delenv("HF_HOME", raising=False)
    data.char_vocab.cache_clear()
    data.prepare("wikitext2", tmp_path, cache_dir=tmp_path / "cache")
    # the download's own cache where the user said, the hub's files too: not in the home directory
    assert caches == [(str(tmp_path / "cache"),) * 2]
    data.prepare("wikitext2", tmp_path)   # by default a temporary directory, gone afterwards
    assert not caches[1][0].startswith(os.path.expanduser("~")) and not os.path.exists(caches[1][0])
    for split, hub_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        text = "".join(rows[hub_split])
        assert (tmp_path / "wikitext-2-raw" / f"wiki.{split}.raw").read_text() == text
        ds = data.wikitext2(split, tmp_path, block_len=len(text) - 1)
        assert ds.decode(torch.cat([ds.tensors[0][0], ds.tensors[1][0][-1:]])) == text
    assert not list((tmp_path / "wikitext-2-raw").glob("*.part"))


def tree(root: Path) -> dict:
    """Every path under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def test_reading_writes_nothing_into_the_data_directory(tmp_path, monkeypatch):
    """One shared read-only copy serves a whole course: reading every split of every prepared
    dataset leaves the directory exactly as prepare left it (root ignores write bits, so the
    tree is compared, not only the permissions)."""
    dataset_files.write_wikitext(tmp_path, {k: v * 3 for k, v in WIKI.items()})
    dataset_files.write_mnist(tmp_path)
    dataset_files.use_checksums(dataset_files.write_cifar(tmp_path)[1], monkeypatch.setattr)
    before = tree(tmp_path)
    for p in [tmp_path, *tmp_path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    monkeypatch.setenv("WORKSHOP_DATA", str(tmp_path))
    data.char_vocab.cache_clear()
    try:
        for name, splits in (("wikitext2", ("train", "valid", "test")), ("mnist", ("train", "test")),
                             ("cifar10", ("train", "test"))):
            for split in splits:
                assert len(data.load(name, split)) > 0
    finally:
        for p in [tmp_path, *tmp_path.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert tree(tmp_path) == before


def test_one_rule_chooses_the_data_directory(monkeypatch):
    monkeypatch.delenv("WORKSHOP_DATA", raising=False)
    assert data.resolve_dir(None) == "data"
    monkeypatch.setenv("WORKSHOP_DATA", "/shared/course")
    assert data.resolve_dir(None) == "/shared/course"
    assert data.resolve_dir("here") == "here"  # --data-dir wins
    from source_code.training import ddp, loop
    args = loop.add_common_args(__import__("argparse").ArgumentParser()).parse_args([])
    loop.check_args(args)
    assert args.data_dir == "/shared/course"  # the training scripts honour WORKSHOP_DATA too
    assert ddp.__doc__  # the entry point the Slurm scripts start uses these flags


@pytest.mark.parametrize("dataset", ["wikitext2", "sort"])
def test_a_dataset_the_cnn_cannot_take_is_refused_before_any_work(dataset, capsys):
    from source_code.training import single  # refused by check_args, before seeding or any data
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: single.main(["--dataset", dataset]))
    said = capsys.readouterr()
    assert exit_.value.code == 2, said.out + said.err
    assert said.err.count("\n") == 1, said.err
    assert f"--model smallcnn cannot train on --dataset {dataset}" in said.err
    assert "digits, mnist, cifar10" in said.err


def test_prepare_uses_the_python_it_is_given_and_builds_no_venv_then(root):
    """A login node's site PyTorch module: `make prepare PYTHON=python3` must not build the venv."""
    res = subprocess.run(["make", "-n", "prepare", "PYTHON=python3", "DATA=/course/data", "CACHE=/scratch/c"],
                         cwd=root, capture_output=True, text=True, check=True)
    assert "venv" not in res.stdout and "pip" not in res.stdout, res.stdout
    assert "python3 -m source_code.data prepare --data-dir /course/data" in res.stdout
    assert "--cache-dir /scratch/c" in res.stdout
