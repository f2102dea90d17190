"""An entry point's main() in a rank of processes.spawn, in the group spawn formed.

The scripts' own launches under torchrun are tested where torchrun is the point (a clean exit,
the CLI, the restart drills); here a script's flags, checks, seed, training and output run on
forks of a process that has imported torch already, without a second launch's imports. The
script's ``init_process_group`` and ``destroy_process_group`` do nothing (spawn formed the group
and ends it), and its ``whoami`` answers with the group that is there.
"""
from __future__ import annotations

import importlib

import torch.distributed


class GroupFormed:
    """torch.distributed as the script sees it inside spawn: the group is already formed."""

    def __getattr__(self, name):
        return getattr(torch.distributed, name)

    def init_process_group(self, *args, **kwargs):
        pass

    def destroy_process_group(self, *args, **kwargs):
        pass


def main_in_group(module: str, *argv):
    from source_code import distributed
    script = importlib.import_module(module)
    script.dist = GroupFormed()
    script.whoami = lambda launch_hint: (distributed.context(), None)
    return script.main(list(argv))


def ddp_main(*argv):
    """source_code.training.ddp's main."""
    return main_in_group("source_code.training.ddp", *argv)


def fault_tolerant_main(*argv):
    """source_code.training.ddp_fault_tolerant's main."""
    return main_in_group("source_code.training.ddp_fault_tolerant", *argv)
