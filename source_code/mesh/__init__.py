"""Device meshes: 2D (data x tensor) and 3D (pipeline x data x tensor) parallelism on one mesh.

* ``layout.py``: the mesh itself: which global rank sits at which coordinates, its submeshes,
  and where each rank's shard of a parameter lies (placements, local shape, offsets);
* ``tp.py``: tensor parallelism of the TransformerLM with DTensor's ``parallelize_module``,
  and the 2D model (TP on the "tp" dimension, FSDP2 on the "dp" dimension);
* ``reference.py``: the one-process reference and the loss scaling that makes pieces add up;
* ``parity.py``: 2D training equals one process on the same global batch;
* ``pipeline3d.py``: 3D, ``torch.distributed.pipelining`` on "pp" x all-reduce on "dp" x TP on "tp";
* ``train_2d.py``: the 2D training script (torchrun / Slurm);
* ``figures.py``: the mesh and a parameter's shards drawn from the mesh object.

    torchrun --standalone --nproc-per-node=4 -m source_code.mesh.train_2d --tp 2
"""
