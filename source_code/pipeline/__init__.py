"""Pipeline parallelism: the model cut into stages, one per process, microbatches flowing through.

Lesson files (notebook 10), in reading order:
* simulator.py -- schedules as per-stage operation orders (naive, GPipe, 1F1B) and their
                  timelines from per-operation costs; pure Python, no processes
* more_schedules.py -- interleaved 1F1B (v chunks per rank) and ZB-H1 (backward split into
                  B and W) as orders for the simulator
* formulas.py  -- the bubble (p - 1) / (m + p - 1) (and of the two above), stored microbatches
* stages.py    -- TransformerLM (and an MLP stack) cut into stages; the last stage's loss
* comms.py     -- the point-to-point messages between neighbouring stages
* schedules.py -- run_step: one stage executes its order for real, timing every operation
* library.py   -- the same with torch.distributed.pipelining (PipelineStage + schedules)
* train.py     -- training script: --schedule naive|gpipe|1f1b|lib-gpipe|lib-1f1b|lib-interleaved-1f1b

Harness, measurements, checks:
* harness.py   -- parity with the unsplit model, timed steps (run on every rank)
* bubble.py    -- the bubble measured for m = 1, 2, 4, 8 against the formula: raw, held
                  (every operation a fixed duration) and with one stage slower
* compare.py   -- own GPipe/1F1B vs the library's schedules, step times in one run
* figures.py   -- Gantt charts and plots from measured timestamps
* exercises.py -- check functions of notebook 10's exercise

    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.train --schedule 1f1b
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.compare
"""
