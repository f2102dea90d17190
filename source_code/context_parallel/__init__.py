"""Context parallelism: one long sequence split across ranks, ring attention, zigzag layout,
and the two other families (all-gather of K/V, Ulysses).

Lesson files (notebook 13), in reading order:
* layout.py    -- which tokens a rank holds (contiguous or zigzag), the sequence-length rule,
                  the query-key pairs each rank scores
* partial.py   -- attention of one query chunk against one key chunk: (out, lse) forward,
                  the flash-attention backward from the final lse
* merge.py     -- the log-sum-exp merge of two partial results (online softmax)
* comm.py      -- the ring: send to the next rank, receive from the previous, in the
                  background
* ring.py      -- ring attention forward and backward as one autograd Function
* model.py     -- a TransformerLM block with its attention core exchangeable
* costs.py     -- bytes by formula, the alpha-beta time of a hop, what each mesh dimension sends
* collectives.py -- all-gather / reduce-scatter of the sequence and the all-to-alls between
                  sequence- and head-sharded tensors, each with its backward
* families.py  -- all-gather CP (Llama 3) and Ulysses (DeepSpeed) beside the ring
* overlap.py   -- when a ring hop hides behind the attention: the tokens per rank c*, with
                  the datasheet rates of an H100 node (NVLink) and InfiniBand
* model_step.py -- a whole TransformerLM training step under DP x CP: the tokens with their
                  global positions and their labels, the loss over the global token count,
                  the gradients summed over DP x CP
* library.py   -- torch.distributed.tensor.experimental.context_parallel on the same inputs

Harness, measurements, checks:
* probes.py    -- measuring from outside: a Ring that records every transfer, a kernel
                  wrapper that times block attention and counts the entries it scored
* harness.py   -- parity with full attention on one process, per rank
* family_check.py -- the three families side by side: parity, bytes per rank, memory per rank
* model_check.py -- the model step against one process, and four typical mistakes measured
* memory.py    -- activation bytes of a block as the sequence grows, with and without CP
* timing.py    -- step times of the layouts, overlapped vs serialized transfers, a size sweep
* compare.py   -- entry point: parity on 2 and 4 processes, work per rank, the model step,
                  the library
* figures.py   -- layouts, activation bytes, Gantt chart
* exercises.py -- notebook 13's exercise: check function (solution: solutions/nb13_context_parallel.py)

    python -m source_code.context_parallel.compare
"""
