# Mahti (CSC, Finland): GPU nodes with 4 x NVIDIA A100 (40 GB), 128 CPU cores, 512 GB memory.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="Mahti"
SITE_PARTITION=gpusmall              # 1-2 GPUs of one node
SITE_PARTITION_FULL_NODES=gpumedium  # whole nodes (all 4 GPUs), 1-20 nodes
SITE_GPUS_PER_NODE=4
SITE_GPU_REQUEST="--gres=gpu:a100:{n}"
SITE_CPUS_PER_NODE=128
SITE_MEM_PER_NODE_GB=512
SITE_MAX_CPUS_PER_GPU=32
SITE_MAX_MEM_PER_GPU_GB=120

site_environment() {
    module purge
    module load pytorch
    # InfiniBand HDR200 between nodes; NCCL finds it by itself.
}
