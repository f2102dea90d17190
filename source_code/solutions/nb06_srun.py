"""Reference solution of notebook 06's srun exercise: one launcher per node, its own node rank.

    from source_code.launch.srun_exercise import check_srun_line
    check_srun_line(LINE)

Escaped, ``$SLURM_NODEID`` and ``$SLURM_NNODES`` reach each task's own ``bash -c`` as text and
are expanded there, with that task's values (single quotes around the command do the same).
``--ntasks-per-node=1`` alone is not enough in a batch job: srun takes the job's task count
(``SLURM_NTASKS``) as its ``-n`` and ignores a per-node count that does not fit it, also beside
a ``-N`` (Slurm 22.05 warns "can't honor --ntasks-per-node" and starts the job's count).
"""
LINE = r'srun --ntasks=$SLURM_NNODES --ntasks-per-node=1 bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=\$SLURM_NNODES"'
