"""The same samples in four layouts on disk, and the reader of each: what an epoch asks of the
file system.

    python -m source_code.data_at_scale.formats --out /tmp/das      # writes the four layouts

A sample is one sequence of the sort task (``source_code.data.sequence_task``: 16 tokens, a
separator, the same tokens sorted): 33 bytes, its id its place in the dataset. The dataset is
stored in the order it was made in, as real ones are (by class, by source, by crawl date):
here by the mean of a sample's tokens, so that one shard holds samples alike (section 5 of the
notebook shows what that does to a shuffle).

* ``loose/``: one file per sample (``000123.bin``), what a folder of images is;
* ``shards/``: tar files of ``--per-shard`` samples each, written with WebDataset's
  ``ShardWriter`` (``000123.seq.bin`` inside): read front to back, one open per shard;
* ``array/samples.npy``: one (n, 33) uint8 array, memory-mapped: any sample by its index;
* ``arrow/samples.arrow``: one Arrow IPC file (columns ``id`` and ``seq``), random access too.
"""
from __future__ import annotations

import gc
import os
import warnings
from pathlib import Path

import numpy as np

from source_code import data
from source_code.cli import Parser, positive_int
from source_code.errors import run_main

TOKENS = 16                       # tokens to sort; the separator is token id 16
SEQ_BYTES = 2 * TOKENS + 1        # source, separator, sorted answer


def make_samples(n: int, seed: int = 0) -> np.ndarray:
    """(n, 33) uint8 sequences of the sort task, stored in the order of their tokens' mean."""
    x, y = data.sequence_task("sort", n=n, length=TOKENS, seed=seed).tensors  # (n, 32) each
    seq = np.concatenate([x.numpy(), y[:, -1:].numpy()], axis=1)              # (n, 33)
    order = np.argsort(seq[:, :TOKENS].mean(axis=1), kind="stable")
    return seq[order].astype(np.uint8)


def to_example(seq) -> tuple[np.ndarray, np.ndarray]:
    """(input, target) of one stored sequence, as sequence_task makes them (-100: not scored)."""
    seq = np.frombuffer(seq, dtype=np.uint8) if isinstance(seq, (bytes, bytearray)) else np.asarray(seq)
    x, y = seq[:-1].astype(np.int64), seq[1:].astype(np.int64)                # (32,), (32,)
    y[:TOKENS] = -100
    return x, y


# ---------------------------------------------------------------------------- writing
def write_loose(samples: np.ndarray, root) -> Path:
    out = Path(root) / "loose"
    out.mkdir(parents=True, exist_ok=True)
    for i, seq in enumerate(samples):
        (out / f"{i:06d}.bin").write_bytes(seq.tobytes())
    return out


def write_shards(samples: np.ndarray, root, per_shard: int = 128) -> list[str]:
    """Tar shards of ``per_shard`` samples (the last one shorter), in the dataset's order."""
    import webdataset as wds
    out = Path(root) / "shards"
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, seq in enumerate(samples):
            sink.write({"__key__": f"{i:06d}", "seq.bin": seq.tobytes()})
    return shard_urls(out)


def shard_urls(directory) -> list[str]:
    return sorted(str(p) for p in Path(directory).glob("shard-*.tar"))


def write_array(samples: np.ndarray, root) -> Path:
    out = Path(root) / "array" / "samples.npy"
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, samples)
    return out


def write_arrow(samples: np.ndarray, root) -> Path:
    import pyarrow as pa
    out = Path(root) / "arrow" / "samples.arrow"
    out.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": pa.array(np.arange(len(samples), dtype=np.int32)),
                      "seq": pa.array([s.tobytes() for s in samples], type=pa.binary(SEQ_BYTES))})
    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=256)
    return out


def write_all(samples: np.ndarray, root, per_shard: int = 128) -> dict:
    return {"loose": write_loose(samples, root), "shards": write_shards(samples, root, per_shard),
            "array": write_array(samples, root), "arrow": write_arrow(samples, root)}


# ---------------------------------------------------------------------------- reading: one epoch
def read_loose(directory):
    """(id, bytes) of every sample: one listing, then one open per sample."""
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".bin")):
        with open(os.path.join(directory, name), "rb") as f:
            yield int(name[:6]), f.read()


def read_shards(urls):
    """(id, bytes) of every sample, shard after shard, with WebDataset: one open per shard."""
    import webdataset as wds
    for sample in wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()):
        yield int(sample["__key__"]), sample["seq.bin"]


def read_array(path):
    """(id, bytes) of every row of the memory-mapped array: the pages are read as they are touched."""
    rows = np.load(path, mmap_mode="r")                                       # (n, 33)
    for i in range(len(rows)):
        yield i, rows[i].tobytes()


def read_arrow(path):
    """(id, bytes) of every row of the Arrow file, opened through Python (so its open is counted)."""
    import pyarrow as pa
    with open(path, "rb") as f:
        table = pa.ipc.open_file(f).read_all()
    for i, seq in zip(table["id"].to_pylist(), table["seq"].to_pylist()):
        yield i, seq


def load_shards(urls, split: bool = False) -> dict[int, bytes]:
    """{id: bytes} of every shard, or only of this rank's shards (WebDataset's split_by_node,
    which reads RANK and WORLD_SIZE): a dataset small enough to hold in memory, by id."""
    import webdataset as wds
    stages = [wds.SimpleShardList(urls)] + ([wds.split_by_node] if split else []) + [wds.tarfile_to_samples()]
    with warnings.catch_warnings():   # WebDataset leaves its tar streams to the garbage collector
        warnings.simplefilter("ignore", ResourceWarning)
        found = {int(s["__key__"]): s["seq.bin"] for s in wds.DataPipeline(*stages)}
        gc.collect()
    return found


def as_array(found: dict[int, bytes], n: int | None = None) -> np.ndarray:
    """The (n, 33) array of ``load_shards``' samples, row = id (rows of ids not found stay 0)."""
    n = max(found) + 1 if n is None else n
    out = np.zeros((n, SEQ_BYTES), dtype=np.uint8)
    for i, seq in found.items():
        out[i] = np.frombuffer(seq, dtype=np.uint8)
    return out


READERS = {"loose": read_loose, "shards": read_shards, "array": read_array, "arrow": read_arrow}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory to write the four layouts into")
    p.add_argument("--samples", type=positive_int, default=1210)
    p.add_argument("--per-shard", type=positive_int, default=128)
    p.add_argument("--only", choices=["all", "shards"], default="all", help="write every layout or the shards only")
    args = p.parse_args(argv)
    samples = make_samples(args.samples)
    if args.only == "shards":
        urls = write_shards(samples, args.out, args.per_shard)
        print(f"summary: samples={len(samples)} shards={len(urls)} dir={Path(args.out) / 'shards'}")
        return 0
    paths = write_all(samples, args.out, args.per_shard)
    print(f"summary: samples={len(samples)} loose={len(os.listdir(paths['loose']))} "
          f"shards={len(paths['shards'])} array={paths['array']} arrow={paths['arrow']}")
    return 0


if __name__ == "__main__":
    run_main(main)
