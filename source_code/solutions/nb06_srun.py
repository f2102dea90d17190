"""Reference solution of notebook 06's srun exercise: one launcher per node, its own node rank.

    from source_code.launch.srun_exercise import check_srun_line
    check_srun_line(LINE)

Escaped, ``$SLURM_NODEID`` and ``$SLURM_NNODES`` reach each task's own ``bash -c`` as text and
are expanded there, with that task's values (single quotes around the command do the same).
``--ntasks-per-node=1`` alone is not enough in a batch job: srun takes the job's task count
(``SLURM_NTASKS``) as its ``-n`` and ignores a per-node count that does not fit it ("can't honor
--ntasks-per-node"). Since Slurm 23.02.5 a ``-N`` on the line sets that count aside, so
``srun -N "$SLURM_NNODES" --ntasks-per-node=1 ...`` is right on the sites too; Slurm 22.05 (the
local test cluster's) still starts the job's count there. ``--ntasks`` on the line is right on both.
"""
LINE = r'srun --ntasks=$SLURM_NNODES --ntasks-per-node=1 bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=\$SLURM_NNODES"'
