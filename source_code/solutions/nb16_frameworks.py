"""Reference solution for the exercise of notebook 16 (frameworks), checked by
tests/test_frameworks_exercise.py.

    python -m pytest tests/test_frameworks_exercise.py
"""
from __future__ import annotations

import torch.nn.functional as F


def accelerate_loop(accelerator, model, optimizer, loader, epochs):
    """The plain loop with Accelerate: one prepare call, accelerator.backward instead of loss.backward."""
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        model.train()
        for x, y in loader:  # each process gets its share of the batches, on its device
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
    return model
