"""An entry point's main() in a rank of processes.spawn, in the group spawn formed.

The scripts' own launches under torchrun are tested where torchrun is the point (a clean exit,
the CLI, the restart drills); here a script's flags, checks, seed, training and output run on
forks of a process that has imported torch already, without a second launch's imports. The
script's ``init_process_group`` and ``destroy_process_group`` do nothing (spawn formed the group
and ends it), and its ``whoami`` answers with the group that is there; a script that joins through
``distributed.session`` gets the group that is there, seeded as the session would seed it.
"""
from __future__ import annotations

import contextlib
import importlib
import io

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


@contextlib.contextmanager
def _formed_session(launch_hint=None, allow_single=False, seed=None):
    from source_code import distributed
    ctx = distributed.context()
    if seed is not None:
        distributed.seed_everything(seed, ctx.rank)
    yield ctx


def session_main(module: str, *argv) -> tuple[int, str]:
    """A script whose main() joins with ``with session(...) as ctx:`` (sharding, mesh, ...):
    (its exit status, what this rank printed). The output is returned, not read from the
    test's stdout: spawn's fork server keeps the stdout of the test that started it."""
    script = importlib.import_module(module)
    script.session = _formed_session
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = script.main([str(a) for a in argv])
    return code, out.getvalue()


def main_output(module: str, *argv) -> tuple[int, str]:
    """``main_in_group``'s (exit status, what this rank printed), for a script that joins through
    ``whoami`` and ``init_process_group`` (returned, not read from the test's capture: see above)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main_in_group(module, *[str(a) for a in argv])
    return code, out.getvalue()


def ddp_main(*argv):
    """source_code.training.ddp's main."""
    return main_in_group("source_code.training.ddp", *argv)


def fault_tolerant_main(*argv):
    """source_code.training.ddp_fault_tolerant's main."""
    return main_in_group("source_code.training.ddp_fault_tolerant", *argv)
