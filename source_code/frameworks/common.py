"""What the framework scripts share with the plain DDP script (source_code/training/ddp.py).

The same flags (training/loop.py), the same data split and sampler, the same model and SGD
optimizer seeded the same way, the same evaluation and the same last line: only the part a
framework takes over differs between the scripts, so the notebook can show exactly that.
"""
from __future__ import annotations

import logging
import os
import warnings

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from source_code import data, device_policy
from source_code.cli import Parser, writable_path
from source_code.distributed import cleanup, place, ranks_from_env
from source_code.errors import LaunchError
from source_code.training import loop


def parser(doc: str) -> Parser:
    """The plain script's flags (loop.add_common_args) plus --save-weights for the parity tests."""
    p = loop.add_common_args(Parser(description=doc.splitlines()[0]))
    p.add_argument("--save-weights", type=writable_path, default="",
                   help="rank 0 writes the trained model's full state_dict here (for comparisons)")
    return p


def check(args) -> None:
    """Flags the frameworks do not support here, then the plain script's checks; before any work."""
    if args.checkpoint or args.resume:
        raise LaunchError("error: --checkpoint/--resume belong to the plain DDP script; the framework "
                          "scripts save their final weights with --save-weights PATH")
    loop.check_args(args)


class Job:
    """Where this process sits in the job, read from the launcher's variables (torchrun or srun),
    without forming a process group: the frameworks form it themselves."""

    def __init__(self):
        found = ranks_from_env()
        self.rank, self.local_rank, self.world_size, self.launcher = found or (0, 0, 1, "none")
        self.local_world_size = device_policy.local_world_size(os.environ, self.world_size)
        self.num_nodes = max(self.world_size // max(self.local_world_size, 1), 1)
        # the one device policy decides CPU or GPU for the whole job (under torchrun the ranks
        # exchange their views through its store); the framework then places each rank itself
        self.device_type = place(self.rank, self.local_rank, self.world_size).device.type

    def check_batch(self, batch_size: int) -> int:
        return loop.per_rank_batch(batch_size, self.world_size)


def datasets(args):
    """(training set, held-out loader): the digits split every script of the track uses."""
    train_set = data.load(args.dataset, "train", args.data_dir)
    test_loader = DataLoader(data.load(args.dataset, "test", args.data_dir), batch_size=256)
    return train_set, test_loader


def sharded_loader(train_set, args, rank: int, world_size: int, device) -> DataLoader:
    """The plain script's per-rank loader: DistributedSampler (same seed) and B/N samples per step,
    so a framework that takes this loader sees exactly the plain script's batches."""
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    return loop.loader(train_set, loop.per_rank_batch(args.batch_size, world_size),
                       torch.device(device), args.workers, sampler=sampler)


def summary(world_size: int, epochs: int, accuracy: float, seconds: float, steps: int,
            loss: float, device) -> str:
    """Where the framework computed (its own choice of device, read back from the model), then
    the plain script's summary line plus the optimizer steps and the last epoch's mean loss."""
    return (f"trained on {torch.device(device)}\n"
            f"{loop.summary_line(world_size, epochs, accuracy, seconds)} steps={steps} loss={loss:.4f}")


def full_state_dict(module: torch.nn.Module) -> dict:
    """Plain CPU tensors of every parameter and buffer (DTensor shards gathered: collective)."""
    out = {}
    for name, value in module.state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        out[name] = value.detach().cpu().clone()
    return out


def say(job: Job, text: str) -> None:
    """print on rank 0, also before the framework has formed the process group."""
    if job.rank == 0:
        print(text, flush=True)


def quiet(rank: int) -> None:
    """Keep the frameworks' per-rank chatter out of the output: ranks other than 0 show no
    warnings and log only errors (rank 0 says it once); on rank 0 hints that need no action
    on a CPU demo (few loader workers, the srun hint inside a Slurm job) and deprecations inside
    the libraries themselves (nothing a user of this script can change; ZeRO-3 repeats them
    every step) are hidden."""
    if rank != 0:
        warnings.simplefilter("ignore")
    for pattern in (".*does not have many workers.*", ".*srun. command is available.*",
                    ".*GPU available but not used.*", ".*LeafSpec.* is deprecated.*",
                    ".*all_gather_into_tensor. is deprecated.*", ".*reduce_scatter_tensor. is deprecated.*"):
        warnings.filterwarnings("ignore", message=pattern)
    level = logging.WARNING if rank == 0 else logging.ERROR
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning",
                 "DeepSpeed", "deepspeed", "accelerate", "torch.distributed"):
        logging.getLogger(name).setLevel(level)


def run(train, args, job) -> int:
    """``train(args, job)`` on one core per process, then the process group the framework
    created ends cleanly (see distributed.cleanup): the same tail for every framework script."""
    torch.set_num_threads(1)  # one core per process, as in the plain script
    try:
        train(args, job)
    except BaseException:
        cleanup(barrier=False)  # the other ranks may never reach a barrier
        raise
    cleanup()  # trainer and model are gone with train()'s frame
    return 0
