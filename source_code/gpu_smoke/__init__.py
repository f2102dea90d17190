"""``make gpu-smoke``: every entry point with a GPU path, run for real, one line per check.

    make gpu-smoke                                   # with the project's venv
    PYTHON=python3 make gpu-smoke                    # a machine's own python3 (torch >= 2.6, no venv)
    python3 -m source_code.gpu_smoke                 # the same where make is missing
    python -m source_code.gpu_smoke --list           # every check: name, GPUs it needs, its commands
    python -m source_code.gpu_smoke --only sharding_dcp,profiler
    python -m source_code.gpu_smoke --device cpu --only main_job,resume   # the harness on a CPU
    python -m source_code.gpu_smoke --only mfu --mfu-dim 4096 --mfu-layers 4 --mfu-seq 4096 --mfu-batch 4

With one GPU every single-process entry point runs on cuda:0 (single.py: the main job and its
resume, the frameworks, FSDP2 with a DCP save and resume, ZeRO by hand, the profiler, the
memory report, MFU sized to the free GPU memory; memory_precision.py: counted activations,
the allocator's peak and a memory snapshot); with 2+ GPUs also the multi-rank paths over
NCCL (multi.py: own DDPs, ring and parameter server, pipeline, tensor parallelism, the hang
drill; the 2 x 2 mesh with 4; context_and_experts.py: ring attention with torch's
context_parallel beside it, the MoE layer's all-to-all). Each check asserts from the script's own output that it
computed on the GPU. Missing GPUs: ``skipped: needs 2 gpus``; a framework that is not
installed: ``skipped: not installed``. Exit status 1 if any check failed. The harness is in
harness.py; it imports torch and the workshop's plumbing only (no Jupyter, no datasets).
"""
