"""A dataset whose loading costs CPU time on purpose: "decoding" on the main process or in workers.

Real image pipelines decode JPEGs and augment every sample on the CPU, in the DataLoader. Here
each embedded 8x8 digit is "decoded" by upsampling it to ``size`` x ``size`` and blurring it
``rounds`` times (a 5x5 convolution each), then pooled back to 8x8, so the model and its cost
stay those of the digits while ``rounds`` sets what loading one sample costs.
``rounds=0`` returns the stored tensor: loading is free, as for data already in memory.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from source_code import data


class SlowDigits(Dataset):
    def __init__(self, split: str = "train", rounds: int = 0, size: int = 64):
        self.inner = data.digits(split)
        self.rounds, self.size = rounds, size
        self.kernel = torch.full((1, 1, 5, 5), 1 / 25)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        x, y = self.inner[i]                                   # (1, 8, 8), label
        if self.rounds == 0:
            return x, y
        with torch.no_grad():
            big = F.interpolate(x[None], size=self.size, mode="bicubic", align_corners=False)
            for _ in range(self.rounds):                       # the deliberately costly part
                big = F.conv2d(F.pad(big, (2, 2, 2, 2), mode="reflect"), self.kernel)
            return F.adaptive_avg_pool2d(big, 8)[0], y         # (1, 8, 8) again


def batches(loader, sampler=None):
    """Batches without end: a new epoch (and a new shuffle) whenever the loader runs out."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1
