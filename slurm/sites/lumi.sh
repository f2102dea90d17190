# LUMI-G (CSC/EuroHPC, Finland): nodes with 4 x AMD MI250X = 8 GPU dies (GCDs), each seen by
# PyTorch as one device; 64 cores of which 56 are usable (7 per GCD), 512 GB of which 480 GB for
# jobs. See tests/test_site_profiles.py for the documented limits and their source.
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="LUMI"
SITE_PARTITION=small-g             # partial nodes (1-7 GCDs), up to 4 nodes, 3 days
SITE_PARTITION_MAX_GPUS=7
SITE_PARTITION_FULL_NODES=standard-g  # whole nodes, up to 2 days
SITE_PARTITION_TEST=dev-g          # short runs: at most 3 h
SITE_TEST_MAX_GPUS=256             # 32 nodes
SITE_TEST_MAX_MINUTES=180
# partition=max nodes/max time, as LUMI's partitions page lists them
SITE_LIMITS="small-g=4/3-00:00:00 standard-g=1024/2-00:00:00 dev-g=32/3:00:00"
SITE_GPUS_PER_NODE=8
SITE_GPU_REQUEST="--gpus-per-node={n}"
SITE_CPUS_PER_NODE=56
SITE_MEM_PER_NODE_GB=480
SITE_MAX_CPUS_PER_GPU=7
SITE_MAX_MEM_PER_GPU_GB=60
SITE_GPU_MEM_GB=64                 # each GCD's own HBM2e, not in the 60 above
# CPU-to-GCD binding on a whole node (LUMI's documented masks, local rank 0..7): the 7 cores of
# the NUMA domain next to each GCD; core 0 of every group of 8 is reserved for the system.
# srun uses them as --cpu-bind=mask_cpu:...; under torchrun, slurm/bind_local_rank.sh applies
# mask number LOCAL_RANK to each process.
SITE_CPU_MASKS="0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00,0xfe00000000,0xfe0000000000"
SITE_CONTAINER_RUNTIME=singularity

# The course's PyTorch: the LUMI AI Factory's container (LUMI's "AI Software Environment"
# page). CSC's PyTorch modules for LUMI (/appl/local/csc/modulefiles) stop at torch 2.7.1, have
# no Slingshot support since LUMI's January 2026 drivers, and CSC calls them deprecated in
# favour of these containers. LUMI_SIF picks the image; `ls /appl/local/laifs/containers/` lists
# the releases (the name's tNNN is the torch version: t210 = 2.10, which day 2 needs).
LUMI_SIF_DEFAULT=/appl/local/laifs/containers/lumi-multitorch-u24r70f21m50t210-20260415_130625/lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif

site_environment() {
    module purge
    # the container's bindings to the Slingshot network (RCCL's OFI plugin) and the file systems
    module use /appl/local/laifs/modules
    module load lumi-aif-singularity-bindings
    # every launch runs inside the image (slurm/launch.sh: singularity exec --bind <repository>),
    # unless the submitting shell named another container or a wrapper command
    if [ -z "${WORKSHOP_CONTAINER:-}${WORKSHOP_CONTAINER_EXEC:-}" ]; then
        export WORKSHOP_CONTAINER="${LUMI_SIF:-$LUMI_SIF_DEFAULT}"
    fi
    # Slingshot-11: RCCL must use the high-speed interfaces, not the management network
    export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
    # the gloo half of the mixed backend (cpu:gloo,cuda:nccl: losses, checks, barriers on CPU
    # tensors) opens its own sockets: on the first high-speed interface too (gloo takes one name)
    export GLOO_SOCKET_IFNAME=hsn0
    export NCCL_NET_GDR_LEVEL=PHB
    # MIOpen's kernel cache on node-local /tmp, not on the shared file system (many ranks write
    # it at once); /tmp is per node, so slurm/per_node.sh creates the directory on every node
    export MIOPEN_USER_DB_PATH="/tmp/${USER:-user}-miopen-cache-${SLURM_JOB_ID:-0}"
    export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"
    export SITE_NODE_DIRS="$MIOPEN_USER_DB_PATH"
    # Is RCCL on Slingshot through the container's OFI plugin (aws-ofi-nccl, built for ROCm)?
    # Submit once with RCCL_CHECK=1: the log must show "NET/OFI Initializing aws-ofi-nccl" and
    # "NET/OFI Selected provider is cxi" (older plugins write "Provider"); "NET/Socket" as the
    # transport means the plugin did not load (slow TCP fallback).
    if [ -n "${RCCL_CHECK:-}" ]; then
        export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
    fi
}
