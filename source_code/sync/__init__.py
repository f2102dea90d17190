"""Model synchronisation: how N workers agree on one update (notebooks 02 and 03).

* ``ring_simulation``: parameter server and ring all-reduce simulated in NumPy, step by step,
  with the bytes every worker and every link carries, and the step-by-step drawings.
* ``ring_allreduce``: the chunked ring all-reduce and the naive ring on torch.distributed.
* ``parameter_server``: a parameter server that trains the digits CNN to DDP's weights.
* ``collectives``: the five collectives run on several processes, inputs and outputs shown.
* ``allreduce_benchmark``: an nccl-tests-style table, busbw, and an alpha-beta model fit.
"""
