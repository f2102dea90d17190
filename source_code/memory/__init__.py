"""Memory, precision and recomputation: where the bytes of training go on one device (notebook 08).

    python -m source_code.memory.report     # counted vs formula, precisions, recomputation: one summary line
    python -m source_code.memory.mixed_precision --dp 8   # bytes per parameter of bf16 bookkeepings

* saved.py        -- the bytes autograd saves for backward, counted with saved-tensor hooks
* live.py         -- the peak of live tensor bytes over a block of code (the CPU's allocator peak)
* formula.py      -- activation bytes of the TransformerLM block term by term; Korthikanti's rule
* calculator.py   -- the memory calculator, shared with the planner (source_code/planner/)
* precision.py    -- fp32, autocast, bf16 with master weights, fp16 + GradScaler, pure bf16
* mixed_precision.py -- bf16 with fp32 master weights counted: the ZeRO paper's (DeepSpeed's) and
                     Megatron-LM's bookkeeping (fp32 main gradients, its distributed optimizer)
* fsdp_bf16.py    -- FSDP2's MixedPrecisionPolicy: bytes on the wire, fp32 shards kept
* recompute.py    -- full and selective activation checkpointing, memory and time
* accumulation.py -- gradient accumulation, and DDP's no_sync
* gpu.py          -- on a GPU: max_memory_allocated and a memory snapshot
* report.py       -- the entry point; figures.py, exercises.py -- the notebook's figures and exercise
"""
