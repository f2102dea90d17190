"""Tensor parallelism: each weight matrix split across the ranks, Megatron-style, then DTensor.

Lesson files (notebook 11), in reading order:
* comm.py      -- the border operators as autograd functions (copy_to_tp / reduce_from_tp and
                  the sequence-parallel all-gather / reduce-scatter pairs) and the ledger that
                  counts every collective they issue
* layers.py    -- ColumnParallelLinear and RowParallelLinear, cut from a dense nn.Linear
* model.py     -- TransformerLM's attention, MLP, block and whole model, tensor-parallel,
                  optionally sequence-parallel, built from a dense model's weights
* vocab.py     -- vocabulary-parallel embedding and cross-entropy (``vocab_parallel=True``)
* dtensor.py   -- the same with torch.distributed.tensor.parallel.parallelize_module
* train.py     -- training script: --impl own|dtensor [--sequence-parallel]
* placement.py -- a TP group stays inside one node (checked before launch; mesh/train_2d too)

Harness, measurements, checks:
* harness.py   -- parity with the dense model, collective counts, saved-activation bytes
* compare.py   -- own TP vs DTensor TP: collectives and step times in one run
* figures.py   -- who holds which slice of each weight, collectives per block
* exercises.py -- notebook 11's exercise: check function (solution: solutions/nb11_tensor_parallel.py)

    torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.train --impl own
    torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.compare
"""
