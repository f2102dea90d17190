# local: the test cluster of tests/slurm_cluster.py: nodes n1 and n2 with 2 CPUs and 8000 MB
# each, partition debug, no GPUs (a "GPU" slot is one CPU core: one process per core).
# Sourced by the job scripts (slurm/common.sh); read by source_code.launch.site_profiles.
SITE_NAME="local test cluster"
SITE_PARTITION=debug
SITE_PARTITION_MAX_GPUS=2
SITE_PARTITION_TEST=debug
SITE_TEST_MAX_GPUS=4
SITE_TEST_MAX_MINUTES=15
# partition=max nodes/max time: 2 nodes is the test cluster's size (its partition itself sets no
# limit: scontrol show partition debug says MaxNodes=UNLIMITED MaxTime=UNLIMITED); 1 day is this
# profile's own choice, so that the calculator refuses what a site would
SITE_LIMITS="debug=2/1-00:00:00"
SITE_GPUS_PER_NODE=2               # process slots per node (CPU cores)
SITE_GPU_REQUEST=""                # no GPUs to request
SITE_CPUS_PER_NODE=2
SITE_MEM_PER_NODE_GB=7
SITE_MAX_CPUS_PER_GPU=1
SITE_MAX_MEM_PER_GPU_GB=3
SITE_CONTAINER_RUNTIME=apptainer

site_environment() {
    # the project's Python comes from the submitting shell (venv bin first on PATH)
    :
}
