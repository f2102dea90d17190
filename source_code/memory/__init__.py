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
* optimizer_precision.py -- Adam's moments in fp32, bf16 or 8 bits (block-wise absmax quantisation)
* compensated.py  -- pure bf16 weights that keep small updates: Kahan compensation, stochastic rounding
* fsdp_bf16.py    -- FSDP2's MixedPrecisionPolicy: bytes on the wire, fp32 shards kept
* recompute.py    -- full and selective activation checkpointing, memory and time
* accumulation.py -- gradient accumulation, and DDP's no_sync
* offload.py      -- activation offloading with torch.autograd.graph.save_on_cpu: bytes packed, time
* allocator.py    -- on a GPU: reserved vs allocated memory, fragmentation, expandable_segments
* gpu.py          -- on a GPU: max_memory_allocated and a memory snapshot
* report.py       -- the entry point; figures.py, exercises.py -- the notebook's figures and exercise
"""
