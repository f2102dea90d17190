"""Notebook 13's exercise: the reference merge and block choice pass, typical wrong answers get
the one line that fits them, on configurations drawn afresh at each call (several seeds here)."""
import pytest
import torch

from source_code.context_parallel.exercises import check_ring_step
from source_code.solutions.nb13_context_parallel import reference_block_kind, reference_merge

SEEDS = range(8)


@pytest.mark.parametrize("seed", [*SEEDS, None])
def test_solution_passes(seed):
    assert check_ring_step(reference_merge, reference_block_kind, show=False, seed=seed).startswith("correct")


def averaging(out_a, lse_a, out_b, lse_b):             # no rescaling by the parts' mass
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def weights_not_normalised(out_a, lse_a, out_b, lse_b):  # exp(lse diff) against the larger lse only
    m = torch.maximum(lse_a, lse_b)
    out = torch.exp(lse_a - m).unsqueeze(-1) * out_a + torch.exp(lse_b - m).unsqueeze(-1) * out_b
    return out, torch.logaddexp(lse_a, lse_b)


def no_max_subtraction(out_a, lse_a, out_b, lse_b):
    total = torch.exp(lse_a) + torch.exp(lse_b)
    return (torch.exp(lse_a).unsqueeze(-1) * out_a + torch.exp(lse_b).unsqueeze(-1) * out_b) / total.unsqueeze(-1), torch.log(total)


def stale_lse(out_a, lse_a, out_b, lse_b):              # wrong lse update: the larger one kept
    out, _ = reference_merge(out_a, lse_a, out_b, lse_b)
    return out, torch.maximum(lse_a, lse_b)


def summed_lse(out_a, lse_a, out_b, lse_b):             # wrong lse update: logs added
    out, _ = reference_merge(out_a, lse_a, out_b, lse_b)
    return out, lse_a + lse_b


def diagonal_unmasked(q_chunk, k_chunk, causal):        # the diagonal block taken whole
    return "skip" if causal and k_chunk > q_chunk else "full"


def future_visible(q_chunk, k_chunk, causal):           # the skip case attended
    return "diagonal" if causal and k_chunk == q_chunk else "full"


def future_masked(q_chunk, k_chunk, causal):            # the skip case computed with the triangle
    return "full" if not causal or k_chunk < q_chunk else "diagonal"


def past_skipped(q_chunk, k_chunk, causal):
    return "diagonal" if causal and k_chunk == q_chunk else ("full" if not causal else "skip")


def causal_always(q_chunk, k_chunk, causal):
    return reference_block_kind(q_chunk, k_chunk, True)


def invented_kind(q_chunk, k_chunk, causal):
    return "triangle" if causal and k_chunk == q_chunk else reference_block_kind(q_chunk, k_chunk, causal)


WRONG = [
    (averaging, reference_block_kind, "plain average"),
    (weights_not_normalised, reference_block_kind, "add up to 1"),
    (no_max_subtraction, reference_block_kind, "overflows"),
    (stale_lse, reference_block_kind, "returned lse"),
    (summed_lse, reference_block_kind, "returned lse"),
    (reference_merge, diagonal_unmasked, r"q_chunk=(\d), k_chunk=\1, causal=True\) returned 'full'"),
    (reference_merge, future_visible, "later chunk"),
    (reference_merge, future_masked, "later chunk"),
    (reference_merge, past_skipped, "earlier chunk"),
    (reference_merge, causal_always, "without a causal mask"),
    (reference_merge, invented_kind, "return one of 'full', 'diagonal', 'skip'"),
]


@pytest.mark.parametrize("seed", [*SEEDS, None])
@pytest.mark.parametrize("merge, kind, message", WRONG, ids=[m.__name__ + "-" + k.__name__ for m, k, _ in WRONG])
def test_wrong_answers_get_one_line_with_their_hint(merge, kind, message, seed, capsys):
    line = check_ring_step(merge, kind, seed=seed)
    assert line.startswith("not yet: ") and "\n" not in line, line
    assert __import__("re").search(message, line), line
    assert capsys.readouterr().out == line + "\n"              # what the learner sees: that one line


def test_not_done_yet_and_errors_in_the_learners_code_are_one_line():
    def todo(*args):
        raise NotImplementedError
    assert check_ring_step(todo, reference_block_kind, show=False).startswith("not done yet")

    def broken(out_a, lse_a, out_b, lse_b):
        return out_a @ torch.ones(out_a.shape[-1] + 1, 1), lse_a   # shapes never fit, whatever case is drawn
    line = check_ring_step(broken, reference_block_kind, show=False)
    assert line.startswith("not yet: your code raised RuntimeError") and "\n" not in line, line


def test_the_diagonal_is_not_called_wrong_with_a_list_that_contains_the_answer():
    line = check_ring_step(reference_merge, diagonal_unmasked, show=False, seed=0)
    assert "expected one of" not in line and "'diagonal'" not in line, line


def test_quiet_check_prints_nothing(capsys):
    check_ring_step(reference_merge, reference_block_kind, show=False)
    assert capsys.readouterr().out == ""
