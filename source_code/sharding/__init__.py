"""Sharding: ZeRO built by hand, FSDP2, sharded checkpoints with DCP, memory per rank.

Lessons (the algorithms):
* comm.py           -- chunk bookkeeping and the collectives (all-reduce, reduce-scatter, all-gather)
* zero.py           -- ZeRO stage 1 and 2 by hand (ZeroAdamW)
* own_fsdp.py       -- ZeRO-3 (FSDP) by hand: flat padded shards, gather/free hooks, reduce-scatter
* own_fsdp_mixed.py -- the same in bf16 mixed precision: bf16 all-gather, fp32 reduce-scatter, fp32 shards
* fsdp.py           -- FSDP2 fully_shard per block, meta-device initialisation
* checkpointing.py  -- DCP save/load with an atomic switch, full state dicts for export
Shared plumbing it uses (source_code/): workload.py (TransformerLM config, shard-independent
initial weights, global batches), measure.py (bytes of local tensors, collectives counted, peak
process memory, the synchronised clock).
Scripts and harnesses:
* train.py          -- FSDP2 training with DCP checkpoints, resumable on any number of ranks
* parity.py         -- ZeRO-1/2, ZeroRedundancyOptimizer, FSDP2 vs one process
* own_fsdp_report.py -- FSDP by hand vs one process and fully_shard; resident and peak bytes
* memory_report.py  -- the memory and communication tables for 1, 2, 4 ranks; fsdp_state_bytes_ratio
* fsdp_demo.py      -- all-gathers per step (reshard on/off), meta init, bf16, HSDP on a 2x2 mesh
* bf16_logits.py    -- what the bf16 policy does to the logits, the loss and the head's gradient
* fsdp_demo_text.py -- notebook 09's words for fsdp_demo.py's lines
* dcp_demo.py       -- load a checkpoint on another number of ranks, compare with the full state
* exercises.py      -- the check function of notebook 09's exercise
* figures.py        -- the figures of notebook 09
* notebook_runs.py  -- notebook 09's 2- and 4-process runs, each group of processes started once

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train
    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.parity
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report
    python -m source_code.sharding.memory_report
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.fsdp_demo
"""
