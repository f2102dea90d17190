# LUMI-G (CSC/EuroHPC, Finland): nodes with 4 x AMD MI250X = 8 GPU dies (GCDs), each seen by
# PyTorch as one device; 64 cores of which 56 are usable (7 per GCD), 512 GB of which ~480 usable.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="LUMI"
SITE_PARTITION=small-g             # partial nodes
SITE_PARTITION_FULL_NODES=standard-g  # whole nodes
SITE_GPUS_PER_NODE=8
SITE_GPU_REQUEST="--gpus-per-node={n}"
SITE_CPUS_PER_NODE=56
SITE_MEM_PER_NODE_GB=480
SITE_MAX_CPUS_PER_GPU=7
SITE_MAX_MEM_PER_GPU_GB=60

site_environment() {
    module purge
    module use /appl/local/csc/modulefiles
    module load pytorch
    # Slingshot-11: RCCL must use the high-speed interfaces, not the management network
    export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
    export NCCL_NET_GDR_LEVEL=PHB
    # MIOpen's cache must not live on the shared file system (many ranks write it at once)
    export MIOPEN_USER_DB_PATH="/tmp/${USER:-user}-miopen-cache-${SLURM_JOB_ID:-0}"
    export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"
}
