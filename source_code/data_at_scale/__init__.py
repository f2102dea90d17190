"""Notebook 20: data at scale. Many small files against shards, staging to node-local storage,
equal batches on every rank, exactly-once resume on another world size, shuffling shards.

Read in this order:
* ``formats.py``: the same samples as loose files, tar shards (WebDataset), one array file and
  one Arrow file, and the reader of each: what an epoch asks of the file system;
* ``fsops.py``: the counter of opens, stats and listings a reader makes, and a shared file
  system's metadata latency (a published figure) added to each;
* ``staging.py``: the copy to a node's local directory, once per node, and when it pays;
* ``cursor.py``: who reads which sample: by shard, by sample (dropped or padded to equal
  counts), and the global cursor that survives a change of world size;
* ``loops.py``: the training loops the notebook shows (plain DDP, with ``Join``, from the cursor);
* ``drills.py``: those loops on real processes: the hang of uneven shards caught by a short
  timeout, ``Join`` and the padded split, a stop on 4 ranks and a resume on 3;
* ``samplers.py``: what a DistributedSampler restarted at the epoch and torchdata's
  StatefulDataLoader do across the same change of world size, counted;
* ``shuffling.py``: shard, buffer and global shuffles, how far each is from random, and the
  loss each gives on the sort task;
* ``train.py``: the Slurm job's training (staged shards, stop, resume on another world size);
* ``report.py``: everything of the notebook in one run, ending with its ``summary:`` line;
* ``exercise.py``: the check of the notebook's exercise.
"""
