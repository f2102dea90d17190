"""Reference solution of notebook 04's exercise: a DataParallel step with real replicas.

    from source_code.training.dataparallel_exercise import check_replica_step
    check_replica_step(replica_step)
"""
import copy

import torch.nn.functional as F


def replica_step(module, x, y, n):
    chunks_x, chunks_y = x.chunk(n), y.chunk(n)                 # 1. scatter
    replicas = [copy.deepcopy(module) for _ in chunks_x]         # 2. replicate (every step)
    for replica, cx, cy in zip(replicas, chunks_x, chunks_y):    # 3. apply (one thread each in DP)
        weight = len(cx) / len(x)                                # this chunk's share of the mean
        (weight * F.cross_entropy(replica(cx), cy)).backward()
    for p, *copies in zip(module.parameters(), *(r.parameters() for r in replicas)):
        p.grad = sum(c.grad for c in copies)                     # 4. sum onto the first device
