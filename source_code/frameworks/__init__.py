"""The plain DDP training (source_code/training/ddp.py) in three frameworks, and a comparison.

Lesson files (notebook 16), in reading order:
* common.py            -- what every script shares with the plain one: flags, data, sampler,
                          model, summary line, and keeping the frameworks' per-rank chatter out
* lightning_train.py   -- PyTorch Lightning: DDP, or fully_shard via ModelParallelStrategy
* accelerate_train.py  -- Hugging Face Accelerate: your loop, prepare() and backward(); the
                          world-size trap caught; accelerate_fsdp2.yaml for FSDP2 on GPUs
* deepspeed_train.py   -- DeepSpeed ZeRO-1/2/3 from deepspeed_zero.json, on CPU with gloo

Harness, measurements, checks:
* compare.py    -- runs under torchrun, saved weights compared, lines of code, the table
* batches.py    -- which examples each process gets: Accelerate's sharding vs DistributedSampler
* exercises.py  -- notebook 16's exercise (a plain loop made an Accelerate loop) and its check

    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.lightning_train
    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.accelerate_train
    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.deepspeed_train --zero-stage 3
    python -m source_code.frameworks.compare
"""
