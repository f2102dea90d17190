"""Small MNIST, CIFAR-10 and WikiText-2 files in the exact on-disk formats their downloads have
(IDX files, pickled CIFAR batches, raw text), with generated content: the offline reading path is
exercised end to end without network, in-process and by jobs.

    write_mnist(root, n_train, n_test)   -> {"train": (images, labels), "test": (...)}
    write_cifar(root, n_per_batch, n_test) -> (truth, checksums)
    write_wikitext(root, texts)

torchvision checks every CIFAR-10 file against the md5 sums of the real download; ours differ,
so ``checksums`` tells torchvision ours (``use_checksums``), in this process or, through the
environment variable TEST_CIFAR_MD5 read by tests/cifar_checksums.py, in a job's processes.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import struct
from pathlib import Path

import numpy as np


def write_idx(path, array: np.ndarray, magic: int):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def write_mnist(root: Path, n_train: int = 6, n_test: int = 4, seed: int = 0) -> dict:
    """MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte under ``root``. Labels follow a
    learnable rule (the brightest of ten horizontal bands) so a few steps of training show it."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    truth = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 64, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        for i, label in enumerate(labels):
            images[i, 2 + 2 * label: 4 + 2 * label] = 255
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images, 0x00000803)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, 0x00000801)
        truth["train" if prefix == "train" else "test"] = (images, labels)
    return truth


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


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_cifar(root: Path, n_per_batch: int = 3, n_test: int = 4, seed: int = 1):
    """cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} under ``root``."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def write_batch(name, n):
        images = rng.integers(0, 256, (n, 3072), dtype=np.uint8)  # 1024 R, 1024 G, 1024 B
        labels = rng.integers(0, 10, n).tolist()
        with open(folder / name, "wb") as f:
            Py2Pickler(f, protocol=2).dump({
                b"batch_label": name.encode(), b"labels": labels, b"data": images,
                b"filenames": [f"{i}.png".encode() for i in range(n)]})
        return images, labels, [name, _md5(folder / name)]

    train = [write_batch(f"data_batch_{i}", n_per_batch) for i in range(1, 6)]
    test = write_batch("test_batch", n_test)
    with open(folder / "batches.meta", "wb") as f:
        Py2Pickler(f, protocol=2).dump({b"label_names": [c.encode() for c in "abcdefghij"],
                                        b"num_vis": 3072})
    checksums = {"train_list": [t[2] for t in train], "test_list": [test[2]],
                 "meta_md5": _md5(folder / "batches.meta")}
    truth = {"train": (np.concatenate([t[0] for t in train]), sum((t[1] for t in train), [])),
             "test": test[:2]}
    return truth, checksums


def use_checksums(checksums: dict, setattr_=setattr) -> None:
    """Point torchvision's CIFAR10 at our files' md5 sums (``setattr_``: monkeypatch.setattr)."""
    from torchvision.datasets import CIFAR10
    setattr_(CIFAR10, "train_list", checksums["train_list"])
    setattr_(CIFAR10, "test_list", checksums["test_list"])
    setattr_(CIFAR10, "meta", {**CIFAR10.meta, "md5": checksums["meta_md5"]})


def checksums_env(checksums: dict) -> dict:
    return {"TEST_CIFAR_MD5": json.dumps(checksums)}


WIKI = {"train": " = Valkyria Chronicles = \n\n Senjō no Valkyria is a game .\n The game began "
                 "development in 2010 , carrying over a large portion of the work .\n",
        "valid": " = Tower Building = \n\n The tower is tall ; Ω is new .\n" * 2,
        "test": " = Robert Boulter = \n\n Robert Boulter is an English actor .\n"}


def write_wikitext(root: Path, texts: dict | None = None) -> None:
    folder = Path(root) / "wikitext-2-raw"
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (texts or WIKI).items():
        (folder / f"wiki.{split}.raw").write_text(text, encoding="utf-8")
