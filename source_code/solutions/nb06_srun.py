"""Reference solution of notebook 06's srun exercise: one launcher per node, its own node rank.

    from source_code.launch.srun_exercise import check_srun_line
    check_srun_line(LINE)

Escaped, ``$SLURM_NODEID`` and ``$SLURM_NNODES`` reach each task's own ``bash -c`` as text and
are expanded there, with that task's values (single quotes around the command do the same).
"""
LINE = r'srun --ntasks-per-node=1 bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=\$SLURM_NNODES"'
