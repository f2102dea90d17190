"""DistributedDataParallel taken apart: what torch's DDP does, rebuilt by hand in small steps.

* naive.py     -- broadcast the weights once, all-reduce every gradient after backward()
* bucketed.py  -- gradient hooks fill buckets in reverse order and all-reduce them while
                  backward() is still running (communication overlaps computation)
* no_sync.py   -- gradient accumulation: k micro-batches under no_sync() == one k-times larger
                  batch (torch's DDP.no_sync and the bucketed version's equivalent)
* compare.py   -- own naive vs own bucketed vs torch DDP in one run: step times, equal weights
* exercises.py -- check functions for the exercises of notebook 05

    torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.compare
    torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.no_sync
"""
