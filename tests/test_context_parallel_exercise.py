"""Notebook 13's exercise: the reference merge and block choice pass, typical wrong answers fail
with the hint that fits them."""
import pytest
import torch

from source_code.context_parallel.exercises import check_ring_step
from source_code.solutions.nb13_context_parallel import reference_block_kind, reference_merge


def test_solution_passes():
    assert check_ring_step(reference_merge, reference_block_kind).startswith("correct")


def averaging(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def no_max_subtraction(out_a, lse_a, out_b, lse_b):
    total = torch.exp(lse_a) + torch.exp(lse_b)
    return (torch.exp(lse_a).unsqueeze(-1) * out_a + torch.exp(lse_b).unsqueeze(-1) * out_b) / total.unsqueeze(-1), torch.log(total)


def stale_lse(out_a, lse_a, out_b, lse_b):
    out, _ = reference_merge(out_a, lse_a, out_b, lse_b)
    return out, torch.maximum(lse_a, lse_b)


def diagonal_unmasked(q_chunk, k_chunk, causal):
    return "skip" if causal and k_chunk > q_chunk else "full"


def future_visible(q_chunk, k_chunk, causal):
    return "diagonal" if causal and k_chunk == q_chunk else "full"


def past_skipped(q_chunk, k_chunk, causal):
    return "diagonal" if causal and k_chunk == q_chunk else ("full" if not causal else "skip")


def causal_always(q_chunk, k_chunk, causal):
    return reference_block_kind(q_chunk, k_chunk, True)


@pytest.mark.parametrize("merge, kind, message", [
    (averaging, reference_block_kind, "plain average"),
    (no_max_subtraction, reference_block_kind, "overflows"),
    (stale_lse, reference_block_kind, "returned lse"),
    (reference_merge, diagonal_unmasked, "lower triangle"),
    (reference_merge, future_visible, "none is visible"),
    (reference_merge, past_skipped, "all of them are visible"),
    (reference_merge, causal_always, "without a causal mask"),
])
def test_wrong_answers_fail(merge, kind, message):
    with pytest.raises(AssertionError, match=message):
        check_ring_step(merge, kind)


def test_not_done_yet():
    def todo(*args):
        raise NotImplementedError
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_ring_step(todo, reference_block_kind)
