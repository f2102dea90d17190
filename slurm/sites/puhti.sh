# Puhti (CSC, Finland): GPU nodes with 4 x NVIDIA V100 (32 GB), 40 CPU cores, 384 GB memory.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="Puhti"
SITE_PARTITION=gpu                 # gputest: 15 min, for trying things out
SITE_GPUS_PER_NODE=4
SITE_GPU_REQUEST="--gres=gpu:v100:{n}"   # {n} = GPUs per node
SITE_CPUS_PER_NODE=40
SITE_MEM_PER_NODE_GB=384
SITE_MAX_CPUS_PER_GPU=10
SITE_MAX_MEM_PER_GPU_GB=95

site_environment() {
    module purge
    module load pytorch
    # InfiniBand EDR between nodes; NCCL finds it by itself.
}
