"""Notebook 13's CP model step, single-process: what each rank holds (tokens, global positions,
labels shifted before the split) for every rank of 2 and 4, what shifting after the split loses,
and on a one-process group the step equals one process and the harness's mistake-free step is
the lesson's step. The 2- and 4-process runs against one process run once, in notebook 13."""
import pytest
import torch
import torch.distributed as dist

from source_code import workload
from source_code.context_parallel import layout as lay
from source_code.context_parallel import model_check as mc
from source_code.context_parallel import model_step as ms


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("layout", lay.LAYOUTS)
def test_each_rank_holds_its_tokens_at_their_global_positions_with_their_labels(cp, layout):
    inputs, targets = mc.uneven_batch(mc.answer_length(cp))
    seen = []
    for r in range(cp):
        tokens, positions, labels = ms.split_sequence(inputs, targets, r, cp, layout)
        assert torch.equal(tokens, inputs[:, positions]) and torch.equal(labels, targets[:, positions])
        seen += positions.tolist()
        # the label of every scored token is the input at the next GLOBAL position, chunk ends included
        nxt = positions + 1
        inside = nxt < inputs.shape[1]
        scored = labels[:, inside] != -100
        assert torch.equal(labels[:, inside][scored], inputs[:, nxt[inside]][scored])
    assert sorted(seen) == list(range(inputs.shape[1])), "positions lost or doubled"


def test_rank_one_does_not_start_at_position_zero():
    inputs, targets = mc.uneven_batch(16)
    _, positions, _ = ms.split_sequence(inputs, targets, 1, 2, "zigzag")
    assert positions.tolist() == list(range(8, 24))


@pytest.mark.parametrize("cp", [2, 4])
def test_shifting_after_the_split_loses_exactly_the_scored_chunk_ends(cp):
    inputs, targets = mc.uneven_batch(mc.answer_length(cp))
    lost = 0
    for r in range(cp):
        tokens, positions, labels = ms.split_sequence(inputs, targets, r, cp, "zigzag")
        made = mc.shift_after_split(tokens, labels)
        size = tokens.shape[1] // 2
        ends = torch.zeros(tokens.shape[1], dtype=torch.bool)
        ends[size - 1::size] = True                                       # each chunk's last token
        assert torch.equal(made[:, ~ends], labels[:, ~ends]), "a label inside a chunk changed"
        assert (made[:, ends] == -100).all(), "a chunk's last token kept a label"
        lost += int((labels[:, ends] != -100).sum())
    assert lost > 0, "the batch scores no chunk end: the contrast would show nothing"


def test_the_batch_gives_ranks_uneven_scored_tokens():
    inputs, targets = mc.uneven_batch(16)
    per_rank = [int((ms.split_sequence(*workload.rank_slice((inputs, targets), d, 2), c, 2, "zigzag")[2] != -100).sum())
                for d in range(2) for c in range(2)]
    assert sum(per_rank) == sum(mc.COUNTS) and len(set(per_rank)) == 4, per_rank


def test_step_on_one_process_is_the_reference_and_the_harness_step_is_the_lessons(one_process_group):
    cfg = mc.model_config(16)
    inputs, targets = mc.uneven_batch(16)
    ref = mc.reference(cfg, inputs, targets)
    g = ms.mesh_groups(1, 1)
    lesson = mc.compared(lambda m, x, y: ms.train_step(m, x, y, g), cfg, inputs, targets, ref)
    assert lesson["loss_diff"] <= 1e-6 and lesson["grad_diff"] <= 1e-6, lesson
    a, b = (workload.build_model(cfg, mc.SEED) for _ in range(2))
    la, lb = ms.train_step(a, inputs, targets, g), mc.mistaken_step(b, inputs, targets, g, None)
    assert torch.equal(la, lb)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa.grad, pb.grad), "mistaken_step(None) is not train_step's lines"


def test_a_grid_that_is_not_the_job_and_an_unknown_mistake_are_refused(one_process_group):
    with pytest.raises(ValueError, match="choose dp and cp whose product is 1"):
        ms.mesh_groups(2, 2)
    g = ms.mesh_groups(1, 1)
    with pytest.raises(ValueError, match="mistake must be None or one of"):
        mc.mistaken_step(None, None, None, g, "typo")
