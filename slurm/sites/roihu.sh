# Roihu-GPU (CSC, Finland; replaces Puhti and Mahti, whose compute services closed on 31 Jul and
# 31 Aug 2026): 132 nodes of 4 NVIDIA GH200 superchips, each one H100 GPU (96 GiB) and one
# 72-core ARM Grace CPU, InfiniBand NDR (one 200 Gb/s link per GPU). Allocation type G: the
# cores (up to 72) and memory a job gets follow from the GPUs it asks for, so the header asks
# for no memory: per GPU, CSC's "217 GiB" is 122 GiB of LPDDR5 (the Grace CPU's, host memory) plus
# the GPU's own 95 GiB of HBM3, in one address space. Jobs are submitted from the GPU login nodes (roihu-gpu.csc.fi: ARM,
# like the GPU nodes); SSH needs a MyCSC-signed certificate, valid 24 h. See
# tests/test_site_profiles.py for the documented limits and their source.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="Roihu"
SITE_PARTITION=gpumedium             # 1-4 GPUs a job (one node of 4, or up to 4 nodes of fewer), 36 h
SITE_PARTITION_MAX_GPUS=4
SITE_PARTITION_FULL_NODES=gpularge   # 4 GPUs a node, 1-10 nodes, 36 h; only for projects that passed
                                     # CSC's scalability test: a course's two-node jobs run in its
                                     # reservation or in gputest
SITE_PARTITION_FULL_NODES_REQUIRES="for projects that passed CSC's scalability test"
SITE_PARTITION_TEST=gputest          # short runs: at most 15 min, 2 nodes (8 GPUs)
SITE_TEST_MAX_GPUS=8
SITE_TEST_MAX_MINUTES=15
# partition=max nodes/max time[/max GPUs a job], as CSC's batch-job-partitions page lists them:
# gpumedium takes 1-4 nodes and 4 GPUs a job in all (4 nodes x 1, 2 x 2 or 1 x 4), and the site
# step's check counts both (on Roihu: scontrol show partition gpumedium, sinfo -s)
SITE_LIMITS="gpumedium=4/36:00:00/4 gpularge=10/36:00:00 gputest=2/15"
SITE_GPUS_PER_NODE=4
SITE_GPU_REQUEST="--gres=gpu:gh200:{n}"   # {n} = GPUs per node
SITE_CPUS_PER_NODE=288
SITE_MEM_PER_NODE_GB=0             # 0: no memory line (allocation type G: fixed per GPU)
SITE_MAX_CPUS_PER_GPU=72
SITE_MAX_MEM_PER_GPU_GB=122        # host memory (LPDDR5) per reserved GPU, for the table
SITE_GPU_MEM_GB=95                 # the GH200's HBM3 a job may use (CSC: 95 + 122 = 217 GiB a GPU)
SITE_CONTAINER_RUNTIME=apptainer

site_environment() {
    module purge
    # CSC's PyTorch module on Roihu-GPU (renamed from pytorch; 2.10 the default in 2026);
    # PYTORCH_MODULE picks a version (module avail python-pytorch)
    module load "${PYTORCH_MODULE:-python-pytorch}"
    # InfiniBand NDR between nodes; NCCL finds it by itself.
}
