# RETIRED: Mahti's compute services closed on 31 Aug 2026 (CSC's "Systems" page); Roihu replaces
# it (slurm/sites/roihu.sh). Kept as a worked example of a site whose partition follows the GPU
# count (notebook 06 uses it); no course page sends anyone here.
# Mahti (CSC, Finland): GPU nodes with 4 x NVIDIA A100 (40 GB), 128 CPU cores, 490 GiB memory
# for jobs (122.5 GiB per reserved GPU). See tests/test_site_profiles.py for the documented
# limits and their source.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="Mahti"
SITE_RETIRED="compute services closed on 31 Aug 2026: use roihu"
SITE_PARTITION=gpusmall              # 1-2 GPUs of one node, up to 36 h
SITE_PARTITION_MAX_GPUS=2
SITE_PARTITION_FULL_NODES=gpumedium  # larger jobs: all 4 GPUs of each node, 1-6 nodes; CSC still
                                     # allocates per reserved GPU (memory, cores up to 32 a GPU),
                                     # not whole nodes: a job gets the cores it asks for
SITE_PARTITION_TEST=gputest          # short runs: at most 15 min, one node (4 GPUs)
SITE_TEST_MAX_GPUS=4
SITE_TEST_MAX_MINUTES=15
# partition=max nodes/max time, as CSC's batch-job-partitions page lists them
SITE_LIMITS="gpusmall=1/36:00:00 gpumedium=6/36:00:00 gputest=1/15"
SITE_GPUS_PER_NODE=4
SITE_GPU_REQUEST="--gres=gpu:a100:{n}"
SITE_CPUS_PER_NODE=128
SITE_MEM_PER_NODE_GB=490
SITE_MAX_CPUS_PER_GPU=32
SITE_MAX_MEM_PER_GPU_GB=120        # below the 122.5 GiB Mahti gives each GPU
SITE_GPU_MEM_GB=40                 # each A100's own HBM2, not in the 120 above
SITE_CONTAINER_RUNTIME=apptainer

site_environment() {
    module purge
    # CSC's PyTorch module (a container behind wrapper commands); PYTORCH_MODULE picks a version
    module load "${PYTORCH_MODULE:-pytorch}"
    # InfiniBand HDR200 between nodes; NCCL finds it by itself.
}
