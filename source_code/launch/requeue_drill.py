"""The time-limit drill's training: ddp_fault_tolerant, whose first run stops making progress
after a given epoch and waits there until the job stops it.

    REQUEUE_LEAD=30 TRAIN_MODULE=source_code.launch.requeue_drill sbatch --signal=B:USR1@30 \\
        slurm/ddp_fault_tolerant.slurm --epochs 6 --hold-after-epoch 2
    # once the log says "holding after epoch 2": a limit a minute or two away (M: the minutes of
    # RunTime in `scontrol show job <id>`, plus 2; a job's owner may lower its limit)
    scontrol update JobId=<id> TimeLimit=<M>

It stands for a training longer than the job's time limit. A drill that only trained for many
epochs would count on them lasting until Slurm's warning signal: on a fast machine the training
ends first and the job is never requeued; on a slow one it needs more runs than planned. A
short limit set at submission counts on the start and the first epochs fitting in it; set once
the run holds, it does not (tests/test_slurm.py does the same). Here the first run
(SLURM_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT 0) trains ``--hold-after-epoch`` epochs,
each saved as usual, then every rank waits, doing nothing, until the job script's trap stops it
(SIGTERM) and requeues the job; the next run resumes after exactly that epoch and trains to the
end. The training itself is ddp_fault_tolerant's, unchanged: the hold wraps its
per-epoch call from outside.
"""
from __future__ import annotations

import sys
import time

from source_code.cli import Parser, positive_int
from source_code.distributed import print0, run_main
from source_code.launch import faults
from source_code.training import ddp_fault_tolerant, loop


def hold_after(epochs: int, train_epoch=loop.train_epoch):
    """``loop.train_epoch`` that, on the first attempt, waits forever before epoch ``epochs + 1``."""
    calls = [0]

    def wrapped(*args, **kwargs):
        if calls[0] == epochs and faults.first_attempt():
            print0(f"holding after epoch {epochs}: this run waits until the job stops it")
            while True:
                time.sleep(1)
        calls[0] += 1
        return train_epoch(*args, **kwargs)
    return wrapped


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = Parser(description=__doc__.splitlines()[0], add_help=False)
    p.add_argument("--hold-after-epoch", type=positive_int, required=True,
                   help="the first run waits after this many epochs until the job stops it")
    own, rest = p.parse_known_args(argv)
    loop.train_epoch = hold_after(own.hold_after_epoch)
    return ddp_fault_tolerant.main(rest)


if __name__ == "__main__":
    run_main(main)
