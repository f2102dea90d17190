# The launch command lines of the job scripts, composed from the site profile and environment.
# Sourced by slurm/common.sh. Everything is a bash array, so that no argument is split or
# globbed on its way to srun; `print_command` shows an array as a shell would read it.
#
#   IN_CONTAINER   runs a command inside the site's container image (empty: no container):
#                  WORKSHOP_CONTAINER_EXEC="apptainer_wrapper exec" (a site's wrapper command),
#                  or WORKSHOP_CONTAINER=/path/image.sif: $CONTAINER_RUNTIME exec --bind ROOT IMAGE
#                  (CONTAINER_RUNTIME default: the profile's apptainer or singularity)
#   SRUN_PER_NODE  srun starting one task per node (all the node's allocated cores), through slurm/per_node.sh
#   SRUN_PER_GPU   srun starting the job's tasks (with TASK_PER_GPU: one per GPU of the node),
#                  through slurm/per_node.sh
#   torchrun_command NNODES [OPTION...]   sets TORCHRUN_CMD: the launcher, its options, the module

print_command() { printf '%q ' "$@"; echo; }

# A job submitted from inside another job (the terminal of a JupyterLab that runs as a Slurm job)
# inherits that job's SLURM_MEM_PER_CPU / SLURM_MEM_PER_NODE; srun reads them as its own input,
# and beside this job's SLURM_MEM_PER_GPU (the site step's SBATCH_MEM_PER_GPU) it refuses every
# step: "SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive".
# Keep the one of this job's own memory request (scontrol shows it; else the SBATCH_MEM_* the
# submitting shell set) and drop the others, saying so.
drop_inherited_memory() {
    [ -n "${SLURM_JOB_ID:-}" ] || return 0
    local set=() kind v
    for v in CPU NODE GPU; do
        local name=SLURM_MEM_PER_$v
        [ -n "${!name:-}" ] && set+=("$v")
    done
    (( ${#set[@]} > 1 )) || return 0
    local info
    info=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null)
    if [[ $info =~ MemPerTres=[^[:space:]]*gpu ]]; then kind=GPU
    elif [[ $info =~ MinMemoryCPU= ]]; then kind=CPU
    elif [[ $info =~ MinMemoryNode=[1-9] ]]; then kind=NODE
    elif [ -n "${SBATCH_MEM_PER_GPU:-}" ]; then kind=GPU
    elif [ -n "${SBATCH_MEM_PER_CPU:-}" ]; then kind=CPU
    elif [ -n "${SBATCH_MEM_PER_NODE:-}" ]; then kind=NODE
    else return 0                                   # not known: srun says what it finds
    fi
    for v in "${set[@]}"; do
        local name=SLURM_MEM_PER_$v
        if [ "$v" != "$kind" ]; then
            echo "note: $name=${!name} came from the shell this job was submitted from (another job's); dropped, this job's memory is per ${kind,,}"
            unset "$name"
        fi
    done
}

container_prefix() {
    IN_CONTAINER=()
    if [ -n "${WORKSHOP_CONTAINER_EXEC:-}" ]; then
        read -r -a IN_CONTAINER <<< "$WORKSHOP_CONTAINER_EXEC"
    elif [ -n "${WORKSHOP_CONTAINER:-}" ]; then
        local runtime=${CONTAINER_RUNTIME:-${SITE_CONTAINER_RUNTIME:-apptainer}}
        if [ ! -f "$WORKSHOP_CONTAINER" ]; then
            echo "error: WORKSHOP_CONTAINER=$WORKSHOP_CONTAINER is not a file; give the path of the site's PyTorch image (.sif)" >&2
            return 2
        fi
        if ! command -v "$runtime" >/dev/null; then
            echo "error: container runtime $runtime not found; load the site's module for it or set CONTAINER_RUNTIME" >&2
            return 2
        fi
        IN_CONTAINER=("$runtime" exec --bind "$ROOT" "$WORKSHOP_CONTAINER")
    fi
}

srun_commands() {
    # one failed task ends the whole step (and the job) instead of leaving the others waiting
    local srun=(srun --kill-on-bad-exit=1)
    local site_args=()
    read -r -a site_args <<< "${SITE_SRUN_ARGS:-}"
    # the one task of a node (torchrun) gets the node's whole allocation (common.sh says why)
    SRUN_PER_NODE=("${srun[@]}" --ntasks-per-node=1 ${SLURM_CPUS_ON_NODE:+--cpus-per-task=$SLURM_CPUS_ON_NODE}
                   "${site_args[@]}" bash "$ROOT/slurm/per_node.sh")
    SRUN_PER_GPU=("${srun[@]}")
    # a script with one task per GPU (common.sh: TASK_PER_GPU): as many tasks a node as Slurm
    # gave it GPUs, each with its share of the cores; fewer cores than GPUs (a shared partition
    # without --cpus-per-task): the tasks share them (--overcommit), and common.sh says so
    if [ -n "${STEP_CPUS_PER_TASK:-}" ]; then
        local nodes=${SLURM_JOB_NUM_NODES:-1}
        SRUN_PER_GPU+=(--nodes="$nodes" --ntasks=$(( TASKS_PER_NODE * nodes ))
                       --ntasks-per-node="$TASKS_PER_NODE")
        if (( STEP_CPUS_PER_TASK > 0 )); then
            SRUN_PER_GPU+=(--cpus-per-task="$STEP_CPUS_PER_TASK")
        else
            SRUN_PER_GPU+=(--cpus-per-task=1 --overcommit)
        fi
    fi
    # CPU-to-GPU binding for one task per GPU: only where the node runs one task per mask
    local masks=()
    IFS=, read -r -a masks <<< "${SITE_CPU_MASKS:-}"
    if [ "${#masks[@]}" -gt 0 ] && [ "${TASKS_PER_NODE:-${SLURM_NTASKS_PER_NODE:-0}}" = "${#masks[@]}" ]; then
        SRUN_PER_GPU+=("--cpu-bind=mask_cpu:${SITE_CPU_MASKS}")
    fi
    SRUN_PER_GPU+=(bash "$ROOT/slurm/per_node.sh")
}

torchrun_command() {
    local nnodes=$1; shift
    TORCHRUN_CMD=("${IN_CONTAINER[@]}" "${TORCHRUN:-${SITE_TORCHRUN:-torchrun}}"
                  --nnodes="$nnodes" --nproc-per-node="$NPROC_PER_NODE" "$@")
    # sites where torchrun cannot tell from the host name that it hosts the rendezvous store:
    # per_node.sh puts 1 (first node) or 0 in place of @IS_HOST@
    if [ "${RDZV_IS_HOST:-${SITE_RDZV_IS_HOST:-no}}" = yes ] && [ "$nnodes" != 1 ]; then
        TORCHRUN_CMD+=("--rdzv-conf=is_host=@IS_HOST@")
    fi
    if [ -n "${SITE_CPU_MASKS:-}" ]; then
        # every process bound to the cores next to its GPU (slurm/bind_local_rank.sh)
        TORCHRUN_CMD+=(--no-python bash "$ROOT/slurm/bind_local_rank.sh" "$PYTHON" -m "$TRAIN_MODULE")
    else
        TORCHRUN_CMD+=(-m "$TRAIN_MODULE")
    fi
}
