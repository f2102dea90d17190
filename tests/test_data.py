"""Datasets: the embedded ones, and the real ones read from files in their on-disk formats.

The MNIST, CIFAR-10 and WikiText-2 files are written here, small, in the exact formats the
download produces (IDX, pickled CIFAR batches, raw text), so the offline reading path of
source_code.data is exercised end to end without network.
"""
import hashlib
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from source_code import data


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
def write_idx(path, array: np.ndarray, magic: int):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


@pytest.fixture
def mnist_dir(tmp_path):
    rng = np.random.default_rng(0)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    truth = {}
    for prefix, n in (("train", 6), ("t10k", 4)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images, 0x00000803)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, 0x00000801)
        truth["train" if prefix == "train" else "test"] = (images, labels)
    return tmp_path, truth


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


def test_missing_mnist_is_one_line_with_the_prepare_command(tmp_path):
    empty = tmp_path / "empty"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "source_code.data", "show", "--dataset", "mnist",
                          "--data-dir", str(empty)], capture_output=True, text=True, env=env)
    assert res.returncode == 2, res.stderr
    assert res.stdout == "" and res.stderr.count("\n") == 1
    assert f"python -m source_code.data prepare --data-dir {empty} --dataset mnist" in res.stderr


# ---------------------------------------------------------------- CIFAR-10 (pickled batches)
class Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` (BINSTRING), as in the CIFAR-10 files: loaded with
    encoding="bytes" the keys are b"data", b"labels"; torchvision loads with "latin1"."""
    dispatch = dict(pickle._Pickler.dispatch)

    def save_bytes(self, obj):
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)
    dispatch[bytes] = save_bytes


@pytest.fixture
def cifar_dir(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()

    def md5(path):
        return hashlib.md5(path.read_bytes()).hexdigest()

    def write_batch(name, n):
        images = rng.integers(0, 256, (n, 3072), dtype=np.uint8)  # 1024 R, 1024 G, 1024 B
        labels = rng.integers(0, 10, n).tolist()
        with open(folder / name, "wb") as f:
            Py2Pickler(f, protocol=2).dump({
                b"batch_label": name.encode(), b"labels": labels, b"data": images,
                b"filenames": [f"{i}.png".encode() for i in range(n)]})
        return images, labels, [name, md5(folder / name)]

    train = [write_batch(f"data_batch_{i}", 3) for i in range(1, 6)]
    test = write_batch("test_batch", 4)
    with open(folder / "batches.meta", "wb") as f:
        Py2Pickler(f, protocol=2).dump({b"label_names": [c.encode() for c in "abcdefghij"],
                                        b"num_vis": 3072})
    # torchvision verifies the md5 of each file against the real download's: point it at ours
    monkeypatch.setattr(CIFAR10, "train_list", [t[2] for t in train])
    monkeypatch.setattr(CIFAR10, "test_list", [test[2]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5(folder / "batches.meta")})
    truth = {"train": (np.concatenate([t[0] for t in train]), sum((t[1] for t in train), [])),
             "test": test[:2]}
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
WIKI = {"train": " = Valkyria Chronicles = \n\n Senjō no Valkyria is a game .\n The game began "
                 "development in 2010 , carrying over a large portion of the work .\n",
        "valid": " = Tower Building = \n\n The tower is tall ; Ω is new .\n" * 2,
        "test": " = Robert Boulter = \n\n Robert Boulter is an English actor .\n"}


@pytest.fixture
def wiki_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    folder = tmp_path / "wikitext-2-raw"
    folder.mkdir()
    for split, text in WIKI.items():
        (folder / f"wiki.{split}.raw").write_text(text, encoding="utf-8")
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

    def hub(path, *args, **kwargs):  # stands in for the download; everything else is real
        if path != "Salesforce/wikitext":
            return real_load(path, *args, **kwargs)
        assert args == ("wikitext-2-raw-v1",)
        return {split: {"text": lines} for split, lines in rows.items()}

    monkeypatch.setattr(datasets, "load_dataset", hub)
    data.char_vocab.cache_clear()
    data.prepare("wikitext2", tmp_path)
    for split, hub_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        text = "".join(rows[hub_split])
        assert (tmp_path / "wikitext-2-raw" / f"wiki.{split}.raw").read_text() == text
        ds = data.wikitext2(split, tmp_path, block_len=len(text) - 1)
        assert ds.decode(torch.cat([ds.tensors[0][0], ds.tensors[1][0][-1:]])) == text
    assert not list((tmp_path / "wikitext-2-raw").glob("*.part"))
