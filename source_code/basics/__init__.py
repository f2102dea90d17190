"""Code behind notebooks 00 (setup and hardware) and 01 (SGD and data parallelism).

* hardware: what this machine has (cores, memory, torch/CUDA, GPUs, topology)
* ranks: what rank, local rank and world size mean, reported by every process
* pingpong: latency vs bandwidth between two processes (time = alpha + bytes / beta)
* sgd_theory: GD vs SGD vs mini-batch, averaged shard gradients, batch sizes, LR scaling, warmup
* shard_exercise: the check function of notebook 01's exercise
* figures: the plots of both notebooks (saved under images/)
"""
