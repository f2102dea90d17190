"""Profiling and debugging distributed training: where the time goes, how it scales, why it hangs.

Lesson files (notebook 15), in reading order:
* classify.py        -- one function says which operator is communication; the per-operator
                        table; reading a Chrome/Perfetto trace back
* profile_ddp.py     -- torch.profiler (wait/warm-up/active schedule) on the DDP job; a trace per rank
* throughput.py      -- samples/s with the time waiting for data measured apart
* scaling.py         -- strong and weak scaling efficiency over 1, 2, ... processes
* workload.py        -- a dataset whose loading costs CPU time on purpose
* slow_run.py        -- a slow training run with three suspects: the exercise's profile
* mfu.py             -- model and attention FLOPs per step of the TransformerLM; MFU against a
                        datasheet peak (where one exists) and a measured one
* monitor.py         -- nvidia-smi / rocm-smi utilisation; rank 0's progress (a bar only on a terminal)
* hang.py            -- a rank skips an all-reduce: short timeout, DEBUG=DETAIL, flight recorder
* flight_recorder.py -- dump the recorder and find the first collective where the ranks differ

Harness: figures.py (figures of the notebook), exercises.py (check of the exercise: the slow
run's bottleneck and its fix; reference solution in source_code/solutions/nb15_bottleneck.py).

    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.profile_ddp --trace-dir traces
    python -m source_code.profiling.scaling --procs 1,2
    torchrun --standalone --nproc-per-node=1 -m source_code.profiling.throughput --decode-rounds 3 --workers 2
    python -m source_code.profiling.mfu
    python -m source_code.profiling.slow_run
    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.hang --timeout 5
"""
