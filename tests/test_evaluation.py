"""Validation sharded over ranks: sum then divide equals rank 0 alone; the shortcuts do not."""
import pytest

from source_code import processes
from source_code.training import evaluation


def test_shards_are_disjoint_complete_and_unpadded():
    for n in (359, 360, 7):
        for world in (1, 2, 3, 4):
            seen = sorted(i for r in range(world) for i in evaluation.shard(range(n), r, world).indices)
            assert seen == list(range(n)), (n, world)


@pytest.mark.parity
def test_sharded_accuracy_is_exact_on_uneven_shards():
    res = processes.spawn(evaluation.compare, 3, 359, stream=False)
    r = res[0]
    assert all(x == r for x in res), "every rank gets the same numbers"
    assert r["samples"] == 359 and r["world_size"] == 3
    assert r["sharded"] == pytest.approx(r["reference"], abs=1e-12)   # integer counts: exact
    # DistributedSampler repeats 3 - 359 % 3 = 1 sample, or leaves 359 % 3 = 2 out
    assert (r["padded_samples"], r["dropped_samples"]) == (360, 357)
    print(r)


def test_bad_sample_count_is_one_line(capsys):
    from source_code.errors import run_main  # what `python -m ...evaluation` runs; before any group
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: evaluation.main(["--samples", "400"]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "at most 360" in err.splitlines()[-1], err
