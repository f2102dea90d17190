"""Model synchronisation: how N workers agree on one update (notebooks 02 and 03).

Lessons (read in this order):
* ``ring_simulation``: parameter server and ring all-reduce simulated in NumPy, step by step,
  with the bytes every rank sends and receives, and the step-by-step drawings.
* ``comms``: the all-reduce algorithms on torch.distributed -- parameter server, naive ring,
  ring (reduce-scatter + all-gather with isend/irecv), and the library call.
* ``parameter_server``: a parameter server that trains the digits CNN (rank 0 serves).
* ``collectives``: the collectives of torch.distributed with their buffers, inputs and outputs.

Around them (they import the lessons, never the other way round):
* ``harness``: the implementations against dist.all_reduce, the parameter server against DDP.
* ``allreduce_benchmark``: an nccl-tests-style table, busbw, alpha-beta fits, crossover, busbw vs N.
* ``same_moments``: two implementations at two sizes timed in the same moments (the benchmark's
  measure of how the parameter server's lead shrinks with the size).
* ``exercises``: the check functions of the notebooks' exercises.
The byte counts and the alpha-beta fit live in ``source_code/costmodel.py``.
"""
