"""DDP equals one process on the same global batches (and the check is able to fail)."""
import re

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from source_code.parity import rank_indices, tolerance

pytestmark = pytest.mark.parity
TOL = 1e-5


def parity_result(text: str) -> tuple[int, int, float]:
    m = re.search(r"parity: world_size=(\d+) steps=(\d+) max_abs_diff=(\S+)", text)
    assert m, f"no parity line in:\n{text[-2000:]}"
    return int(m[1]), int(m[2]), float(m[3])


def test_reference_order_is_distributed_samplers():
    # the one-process reference rebuilds the ranks' batches from rank_indices: it must be exact
    for n, world in [(256, 4), (10, 3)]:
        for epoch in (0, 2):
            for rank in range(world):
                s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=3)
                s.set_epoch(epoch)
                assert rank_indices(n, world, rank, epoch, seed=3) == list(s)


def test_tolerance_is_the_cpus_on_cpu_and_wider_on_a_gpu():
    """fp32 on the CPU keeps each check's own tolerance; CUDA (other kernels, NCCL's summation
    order at 3+ ranks) gets 10 x, and the sentence printed says so."""
    assert tolerance(torch.device("cpu")) == (TOL, "tolerance 1e-05 on cpu (fp32)")
    assert tolerance("cpu", 1e-6)[0] == 1e-6
    tol, why = tolerance(torch.device("cuda", 3))
    assert tol == pytest.approx(10 * TOL) and "cuda:3" in why and "NCCL" in why
    assert tolerance("cuda", 1e-6)[0] == pytest.approx(1e-5)


def test_ddp_matches_one_process_under_torchrun(torchrun):
    """The entry point with its defaults on 1 process (2 processes: notebook 05 runs it and
    asserts the same), exiting cleanly under torchrun."""
    out = torchrun("source_code.parity", nproc=1).stdout
    world, steps, diff = parity_result(out)
    assert (world, steps) == (1, 12)
    assert diff <= TOL


def _parity_main(*argv):
    """The entry point's main in a rank of processes.spawn, in the group spawn formed (torchrun's
    part, the group's setup from its variables, is what the launches above and notebook 05's show)."""
    import contextlib
    from source_code import distributed, parity
    parity.session = lambda launch_hint=None: contextlib.nullcontext(distributed.context())
    return parity.main(list(argv))


def test_ddp_matches_one_process_on_4_ranks(capfd):
    """4 ranks, where each rank's share of a batch and the padding differ from 2's: the entry
    point's own comparison, on forks of a process that has imported torch already."""
    from source_code.processes import spawn
    assert spawn(_parity_main, 4, stream=True) == [0, 0, 0, 0]
    world, steps, diff = parity_result(capfd.readouterr().out)
    assert (world, steps) == (4, 12)
    assert diff <= TOL


@pytest.mark.parametrize("broken", ["sum", "no-set-epoch"])
def test_broken_ddp_is_caught(torchrun, capfd, broken):
    """Either break makes the difference exceed the tolerance, and the entry point fails with
    one line saying so: under torchrun for one break, on forked ranks for the other (the same
    failure path, without a second launch's imports)."""
    if broken == "sum":
        res = torchrun("source_code.parity", "--break", broken, nproc=2, check=False)
        assert res.returncode != 0
        out = res.stdout
    else:
        from source_code.processes import ProcessesFailed, spawn
        with pytest.raises(ProcessesFailed) as failed:
            spawn(_parity_main, 2, "--break", broken, stream=True)
        out = capfd.readouterr().out + str(failed.value)
    # every rank raises the one line; which rank's report (and whether rank 0's parity line)
    # comes first is the scheduler's choice, so the difference is read from the line itself
    m = re.search(r"differ by (\S+) > tolerance", out)
    assert m, f"--break {broken}: no one-line failure in:\n{out[-2000:]}"
    assert float(m[1]) > TOL, f"--break {broken} went unnoticed (max_abs_diff={m[1]})"
