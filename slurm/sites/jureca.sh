# A JURECA-DC-like system (JSC, Germany): 4 x NVIDIA A100 (40 GB), 128 CPU cores, 512 GB memory;
# whole nodes are allocated, so the header asks for no memory.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="JURECA-like"
SITE_PARTITION=dc-gpu
SITE_PARTITION_MAX_GPUS=4096
SITE_PARTITION_TEST=dc-gpu-devel   # short runs (limits below are this profile's own guess:
                                   # JSC's partition table was not read; on JURECA,
                                   # scontrol show partition dc-gpu-devel gives MaxNodes, MaxTime)
SITE_TEST_MAX_GPUS=16
SITE_TEST_MAX_MINUTES=120
# partition=max nodes/max time: this profile's own guess, like the test partition above
SITE_LIMITS="dc-gpu=128/24:00:00 dc-gpu-devel=4/2:00:00"
SITE_LIMITS_GUESSED=yes            # every refusal on them says so and names scontrol show partition
SITE_GPUS_PER_NODE=4
SITE_GPU_REQUEST="--gres=gpu:{n}"
SITE_CPUS_PER_NODE=128
SITE_MEM_PER_NODE_GB=0             # 0: no --mem line (whole nodes)
SITE_MAX_CPUS_PER_GPU=32
SITE_MAX_MEM_PER_GPU_GB=120        # the node's share per GPU, for the resource table
SITE_GPU_MEM_GB=40                 # each A100's own HBM2, not in the 120 above
SITE_CONTAINER_RUNTIME=apptainer
# torchrun's c10d rendezvous decides whether it hosts the store by comparing the endpoint with
# its own host name; the endpoint is the InfiniBand name (host + "i"), which it does not
# recognise as itself (pytorch/pytorch#73656): every node is told is_host=1|0 explicitly
# (slurm/per_node.sh), and torchrun_jsc (pip install torchrun_jsc) also patches the addresses
# the rendezvous publishes. TORCHRUN=torchrun uses plain torchrun with is_host only.
SITE_RDZV_IS_HOST=yes
SITE_TORCHRUN=torchrun_jsc
SITE_MASTER_SUFFIX=i
SITE_SRUN_ARGS="--cpu-bind=none"   # as JSC's examples start torchrun: its processes use all the task's cores

site_environment() {
    module --force purge
    # The Stage's own PyTorch module is older than the workshop needs (torch >= 2.6): load
    # Python from the Stage and use the workshop venv built on it (WORKSHOP_VENV), torchrun_jsc
    # installed there. STAGE picks the Stage.
    module load "Stages/${STAGE:-2026}" GCC OpenMPI Python
    # the sockets of NCCL/gloo on the InfiniBand interface
    export NCCL_SOCKET_IFNAME=ib0
    export GLOO_SOCKET_IFNAME=ib0
    # every GPU the job has on the node visible to every process of the node, which picks
    # cuda:LOCAL_RANK (JSC's examples set this: Slurm's per-task GPU binding would otherwise hide
    # the others); as many as the job asked for (SLURM_GPUS_ON_NODE), not always all 4
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( ${SLURM_GPUS_ON_NODE:-4} - 1 )))
    export CUDA_VISIBLE_DEVICES
}
