"""Notebook 12's exercise: the reference mesh passes the check, typical wrong meshes fail with a hint."""
import pytest

from source_code.planner.exercises import check_mesh
from source_code.solutions import nb12_mesh


def test_solution_passes():
    assert check_mesh(nb12_mesh.my_mesh()).startswith("correct")


@pytest.mark.parametrize("wrong, message", [
    ({"dp": 4}, "the job has 8 GPUs"),                               # forgot half the GPUs
    ({"dp": 8}, "does not fit"),                                     # plain DDP: Adam state
    ({"dp": 1, "tp": 8}, "spans nodes"),                             # TP across the network
    ({"dp": 8, "zero": 3}, "against"),                               # fits, but re-gathers per micro-batch
    ({"dp": 8, "zero": 2, "checkpointing": True}, "against"),        # fits, pays recomputation
])
def test_wrong_meshes_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_mesh(wrong)


def test_zero2_with_pipeline_passes_with_deepspeeds_note():
    """Within 5 % of the best, but DeepSpeed's pipeline engine would refuse it: the check says so."""
    out = check_mesh({"dp": 4, "tp": 1, "pp": 2, "zero": 2})
    assert out.startswith("correct") and "note: DeepSpeed's pipeline engine refuses ZeRO-2/3" in out


def test_unfinished_exercise_says_so():
    with pytest.raises(NotImplementedError):
        check_mesh(NotImplemented)
