"""The shared training loop: the loss is summed on the device and read once per epoch, with the
numbers a per-step ``loss.item()`` gave."""
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from source_code.training import loop


def _setup(seed=0):
    torch.manual_seed(seed)
    data = TensorDataset(torch.randn(96, 10), torch.randint(0, 3, (96,)))
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), DataLoader(data, batch_size=8)


def _per_step_item(model, opt, data, loss_sum=0.0):
    """The loop as it was: a Python float, loss.item() after every step."""
    total, steps = loss_sum, 0
    for x, y in data:
        steps += 1
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total += loss.item()
    return total / steps, steps


def test_epoch_loss_is_the_per_step_sum_bit_for_bit():
    want = _per_step_item(*_setup(), loss_sum=1.2345)
    model, opt, data = _setup()
    assert loop.train_epoch(model, data, opt, torch.device("cpu"), loss_sum=1.2345) == want


def test_no_host_read_per_step(monkeypatch):
    """One read per epoch (plus one per mid-epoch snapshot), not one per step: on a GPU each
    read makes the CPU wait for the device."""
    model, opt, data = _setup()
    reads, original = [], torch.Tensor.item

    def item(self):  # count the loop's own reads (the DataLoader draws a seed with one too)
        if sys._getframe(1).f_code.co_filename == loop.__file__:
            reads.append(1)
        return original(self)
    monkeypatch.setattr(torch.Tensor, "item", item)
    snapshots = []
    loss, steps = loop.train_epoch(model, data, opt, torch.device("cpu"), every=5,
                                   on_step=lambda s, total: snapshots.append((s, total)))
    assert steps == 12 and len(snapshots) == 2 and len(reads) == 1 + len(snapshots)
    assert abs(snapshots[-1][1] / 10 - loss * 12 / 10) < 1.0  # a running sum, read as a float
    reads.clear()
    acc = loop.evaluate(model, data, torch.device("cpu"))
    assert 0 <= acc <= 1 and len(reads) == 1


def test_summary_and_records_are_read_as_structured_values():
    line = loop.summary_line(2, 3, 0.5, 1.25, [2.30801, 2.2841, 2.2547]) + " resumed_epoch=1 resumed_step=2"
    s = loop.parse_summary("epoch   3/3  loss 2.2547\n" + line)
    assert s == {"world_size": 2, "epochs": 3, "accuracy": 0.5, "seconds": 1.2, "losses": [2.308, 2.2841, 2.2547],
                 "resumed_epoch": 1, "resumed_step": 2}
    assert loop.parse_summary(loop.summary_line(1, 1, 0.25, 0.0, [1.5]))["losses"] == [1.5]   # one epoch: a list
    assert "losses" not in loop.parse_summary(loop.summary_line(1, 1, 0.25, 0.0))
    text = ("[rank1]: parity: impl=zero1 max_abs_diff=0\nparity: impl=zero1 max_abs_diff=0\n"
            "note: the unsplit batch differs by max_abs_diff=1.14e-05 (float rounding)\n"
            "hsdp: placements=(Replicate(),Shard(dim=0)) calls=all_gather:6,all_reduce:3 equal=True\n"
            "parity: impl=fsdp max_abs_diff=2.5e-08")
    assert loop.parse_records(text, "parity") == [{"impl": "zero1", "max_abs_diff": 0},
                                                  {"impl": "fsdp", "max_abs_diff": 2.5e-08}]
    assert loop.parse_records(text, "note") == [{"max_abs_diff": 1.14e-05}]      # prose words skipped
    assert loop.parse_records(text, "hsdp") == [{"placements": "(Replicate(),Shard(dim=0))",
                                                 "calls": "all_gather:6,all_reduce:3", "equal": "True"}]
    assert loop.parse_records(text, "summary") == []


def test_a_long_run_summary_keeps_the_last_epochs_losses():
    line = loop.summary_line(2, 3600, 0.5, 90.0, [float(i) for i in range(3600)])
    got = loop.parse_summary(line)["losses"]
    assert len(got) == loop.LOSSES_SHOWN and got[-1] == 3599.0 and len(line) < 1500
