"""Own ring all-reduce, naive ring and parameter-server reduction vs dist.all_reduce; the exercise."""
import pytest
import torch

from source_code.processes import spawn
from source_code.solutions.nb02_sync import all_gather_phase as solution
from source_code.sync.ring_allreduce import check_all_gather, compare_with_library

SIZES = (1, 5, 1001, 4099)  # smaller than, and not divisible by, the world sizes


@pytest.mark.parity
@pytest.mark.parametrize("world", [2, 3, 4])
def test_implementations_match_dist_all_reduce(world):
    # "ring_small_segments" cuts chunks into 64-byte segments: the pipelined path of big buffers
    diffs = spawn(compare_with_library, world, SIZES)
    for rank_diffs in diffs:
        assert set(rank_diffs) == {(impl, size, op) for impl in ("ring", "ring_small_segments", "naive_ring", "parameter_server")
                                   for size in SIZES for op in ("sum", "avg")}
        worst = max(rank_diffs.values())
        assert worst < 1e-12, rank_diffs


def test_segmented_reduce_scatter_equals_unsegmented():
    from source_code.sync.ring_allreduce import reduce_scatter_phase
    # a fake 1-rank "exchange" would not exercise neighbours; instead compare segment sizes on
    # one rank's arithmetic: world=2, the left neighbour's chunk is simulated by a closure
    world, n = 2, 1000
    data = [torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    out = []
    for seg in (8, 2**20):
        mine = data[0].clone()
        chunks = list(mine.tensor_split(world))
        neighbour = list(data[1].tensor_split(world))

        def exchange(send, recv, neighbour=neighbour):
            recv.copy_(neighbour[1])  # rank 1 sends chunk (1 - 0) % 2 = 1

        def start(sends, recvs, neighbour=neighbour):
            flat = neighbour[1].split(recvs[0].numel())
            waits = []
            for r, f in zip(recvs, flat):
                waits.append(lambda r=r, f=f: r.copy_(f))
            return waits
        exchange.start = start
        reduce_scatter_phase(chunks, 0, world, exchange, segment_bytes=seg)
        out.append(chunks[1].clone())
    assert torch.equal(out[0], out[1])
    assert torch.allclose(out[0], data[0].tensor_split(2)[1] + data[1].tensor_split(2)[1])


def test_exercise_solution_passes_the_check():
    assert check_all_gather(solution) is True


def test_unfinished_exercise_reports_not_done(capsys):
    def todo(chunks, rank, world, exchange):
        raise NotImplementedError
    assert check_all_gather(todo) is False
    assert "not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", ["one_step_short", "wrong_chunk", "whole_buffer"])
def test_wrong_answers_fail_the_check(wrong):
    def answer(chunks, rank, world, exchange):
        if wrong == "one_step_short":
            for s in range(world - 2):
                exchange(chunks[(rank + 1 - s) % world], chunks[(rank - s) % world])
        elif wrong == "wrong_chunk":  # forwards a partial chunk instead of the complete one
            for s in range(world - 1):
                exchange(chunks[(rank - s) % world], chunks[(rank - 1 - s) % world])
        else:
            buf = torch.cat(chunks)
            for _ in range(world - 1):
                exchange(buf, buf.clone())
    with pytest.raises(AssertionError):
        check_all_gather(answer, timeout=2.0)
