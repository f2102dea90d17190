# A JURECA-DC-like system (JSC, Germany): 4 x NVIDIA A100 (40 GB), 128 CPU cores, 512 GB memory.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="JURECA-like"
SITE_PARTITION=dc-gpu
SITE_GPUS_PER_NODE=4
SITE_GPU_REQUEST="--gres=gpu:{n}"
SITE_CPUS_PER_NODE=128
SITE_MEM_PER_NODE_GB=512
SITE_MAX_CPUS_PER_GPU=32
SITE_MAX_MEM_PER_GPU_GB=120

site_environment() {
    module purge
    module load Stages/2024 GCC OpenMPI PyTorch
    # InfiniBand: the rendezvous must use the node's IB name (host name + "i"), and the
    # sockets of NCCL/gloo the IB interface
    export SITE_MASTER_SUFFIX=i
    export NCCL_SOCKET_IFNAME=ib0
    export GLOO_SOCKET_IFNAME=ib0
}
