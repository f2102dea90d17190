"""Predict what a training configuration costs before running it.

* ``memory.py``: per-rank bytes of DDP / ZeRO-1 / ZeRO-2 / FSDP on N ranks (notebook 09);
* ``spec.py``: the model (by name or dimensions), the cluster, a (pp, dp, tp, ZeRO) configuration;
* ``mesh_memory.py``: bytes per GPU of a mesh: parameters, gradients, optimizer state, activations
  (with and without checkpointing);
* ``communication.py``: bytes per step by collective and by link (intra-/inter-node);
* ``search.py`` + ``plan.py``: which meshes fit, ranked, and why the others do not (the CLI);
* ``accumulation.py``: ZeRO-1 / ZeRO-2 with gradient accumulation (one reduce-scatter per step
  or one per micro-batch), bucketed; ``parity.py`` checks it trains as one process;
* ``measured.py`` + ``check.py``: the predictions against bytes counted on real processes;
* ``timing.py``: the step-time model's order of ZeRO-1/2/3 against a measured run;
* ``exercises.py``: notebook 12's exercise.

    python -m source_code.planner.memory --params 124e6 --world-size 8
    python -m source_code.planner.plan --model 70b --cluster lumi --nodes 16
    python -m source_code.planner.check          # planner_max_rel_error=E
    python -m source_code.planner.timing         # planned vs measured step order
"""
