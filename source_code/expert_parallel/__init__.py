"""Expert parallelism: a mixture-of-experts (MoE) layer whose experts live on different ranks.

Lesson files (notebook 14), in reading order:
* router.py   -- top-k gating with softmax (gates renormalised over the k for k >= 2, the
                 probability itself for top-1), capacity per expert (tokens over it are dropped
                 and pass through the residual), the load-balancing auxiliary loss, the router
                 z-loss and DeepSeek-V3's aux-loss-free bias (it changes the choice, not the gates)
* moe.py      -- the MoE layer on one process (experts are models.MLP; optional shared experts
                 that every token passes through), and the TransformerLM with its MLPs swapped
                 for MoE layers; parameters and FLOPs per token counted
* comm.py     -- the all-to-all of expert parallelism: counts first, then the variable-size
                 payload, as an autograd function
* ep_layer.py -- the expert-parallel layer: route, dispatch (all-to-all), local experts,
                 return (all-to-all), combine with the gate weights, shared experts; dropless
                 or with a capacity, whose bound on a rank's receive buffer it states
* ep_dp.py    -- expert x data parallelism on a device mesh: expert gradients reduced over the
                 ranks that hold the same experts, dense gradients over all ranks

Harness, measurements, checks:
* wire.py      -- the bytes each all-to-all moved, counted from the buffers and splits it was
                  handed (a wrapper around dist.all_to_all_single, outside the lesson code)
* harness.py   -- parity with the one-process layer (outputs and gradients), world sizes 2 and 4,
                  shared experts, dropless and capacity on a skewed router
* bench.py     -- all-to-all against all-reduce and all-gather of the same size; skewed routing
                  (an entry point too)
* train.py     -- a short training run of the MoE TransformerLM: without balancing, with the
                  balancing loss, with bias balancing, with the z-loss, with a shared expert,
                  with capacity dropping; the dropped assignments (in training and for each
                  capacity factor), the state bytes and all-reduced gradient bytes per rank, counted
* compare.py   -- the entry point: parity + balancing, one summary line
* figures.py   -- the figures of notebook 14
* exercises.py -- notebook 14's exercise (solution: solutions/nb14_expert_parallel.py)

    python -m source_code.expert_parallel.compare
    torchrun --standalone --nproc-per-node=2 -m source_code.expert_parallel.train
    python -m source_code.expert_parallel.bench
"""
