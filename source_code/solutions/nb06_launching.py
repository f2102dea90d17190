"""Reference solution of notebook 06's exercise: the one-node job script on two nodes.

    from source_code.launch.job_script_exercise import check_job_script
    check_job_script(SCRIPT)
"""

SCRIPT = """#!/bin/bash
#SBATCH --job-name=my-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:05:00

cd "$WORKSHOP_ROOT"                              # the repository (exported before sbatch)
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK   # srun's tasks get the task's cores (Slurm 22.05-23.02)
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 10000 ))

srun torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=2 \\
    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \\
    -m source_code.launch.sync_check
"""
