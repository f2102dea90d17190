# RETIRED: Puhti's compute services closed on 31 Jul 2026 (CSC's "Systems" page); Roihu replaces
# it (slurm/sites/roihu.sh). Kept as a worked example of a per-GPU site with a memory request;
# no course page sends anyone here.
# Puhti (CSC, Finland): GPU nodes with 4 x NVIDIA V100 (32 GB), 40 CPU cores, 384 GB memory of
# which a job may request at most 373 GiB per node (partitions gpu and gputest; see
# tests/test_site_profiles.py for the documented limits and their source).
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="Puhti"
SITE_RETIRED="compute services closed on 31 Jul 2026: use roihu"
SITE_PARTITION=gpu                 # 1-20 nodes, up to 3 days
SITE_PARTITION_MAX_GPUS=80         # every job size goes to the gpu partition
SITE_PARTITION_TEST=gputest        # short runs: at most 15 min, 2 nodes
SITE_TEST_MAX_GPUS=8
SITE_TEST_MAX_MINUTES=15
# partition=max nodes/max time, as CSC's batch-job-partitions page lists them
SITE_LIMITS="gpu=20/3-00:00:00 gputest=2/15"
SITE_GPUS_PER_NODE=4
SITE_GPU_REQUEST="--gres=gpu:v100:{n}"   # {n} = GPUs per node
SITE_CPUS_PER_NODE=40
SITE_MEM_PER_NODE_GB=373           # the partitions' maximum, not the installed 384 GB
SITE_MAX_CPUS_PER_GPU=10
SITE_MAX_MEM_PER_GPU_GB=93         # 373 / 4, rounded down
SITE_GPU_MEM_GB=32                 # each V100's own HBM2, not in the 93 above
SITE_CONTAINER_RUNTIME=apptainer

site_environment() {
    module purge
    # V100 (sm_70) is not in CUDA 13 builds of torch: use CSC's PyTorch module (CUDA 12),
    # not a pip wheel; PYTORCH_MODULE picks a version (module avail pytorch)
    module load "${PYTORCH_MODULE:-pytorch}"
    # InfiniBand EDR between nodes; NCCL finds it by itself.
}
