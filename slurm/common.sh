# Shared by every job script here: site profile, the project's Python, rendezvous variables.
# Not a job script itself: the job scripts `source` it after finding the repository (ROOT).
#
# Inputs (environment; sbatch passes the submitting shell's environment to the job):
#   WORKSHOP_SITE   puhti | mahti | lumi | jureca | local (default): slurm/sites/$WORKSHOP_SITE.sh
#   WORKSHOP_VENV   a virtual environment to activate (else: the python already on PATH,
#                   e.g. an activated venv/conda env, or the one the site's modules provide)
#   TRAIN_MODULE    the Python module to run (default: source_code.training.ddp, the main job)
#   NPROC_PER_NODE  processes per node (default: the GPUs Slurm gave the node; on `local`, its CPUs)

WORKSHOP_SITE=${WORKSHOP_SITE:-local}
profile="$ROOT/slurm/sites/$WORKSHOP_SITE.sh"
if [ ! -f "$profile" ]; then
    echo "error: no site profile $profile; set WORKSHOP_SITE to one of:" \
         $(cd "$ROOT/slurm/sites" && ls *.sh | sed 's/\.sh$//') >&2
    exit 2
fi
# shellcheck source=sites/local.sh
source "$profile"
site_environment
if [ -n "${WORKSHOP_VENV:-}" ]; then
    # shellcheck disable=SC1091
    source "$WORKSHOP_VENV/bin/activate" || { echo "error: WORKSHOP_VENV=$WORKSHOP_VENV is not a venv" >&2; exit 2; }
fi
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch, source_code" 2>/dev/null; then
    echo "error: $(command -v "$PYTHON" || echo "$PYTHON") cannot import torch and source_code;" \
         "activate the workshop environment before sbatch (or export WORKSHOP_VENV=/path/to/venv)" >&2
    exit 2
fi
command -v torchrun >/dev/null || { echo "error: torchrun not on PATH; activate the workshop environment" >&2; exit 2; }
TRAIN_MODULE=${TRAIN_MODULE:-source_code.training.ddp}
cd "$ROOT" || exit 2

# one process per GPU; on a CPU-only site one per allocated core
if [ -z "${NPROC_PER_NODE:-}" ]; then
    if [ -n "$SITE_GPU_REQUEST" ]; then
        NPROC_PER_NODE=${SLURM_GPUS_ON_NODE:-$SITE_GPUS_PER_NODE}
    else
        NPROC_PER_NODE=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}
    fi
fi
# the CPU cores of a task are shared by its processes: no oversubscription by OpenMP threads
export OMP_NUM_THREADS=$(( ${SLURM_CPUS_PER_TASK:-$NPROC_PER_NODE} / NPROC_PER_NODE > 0 ? ${SLURM_CPUS_PER_TASK:-$NPROC_PER_NODE} / NPROC_PER_NODE : 1 ))

# rendezvous: the first host of the job, a port derived from the job id (two jobs sharing a
# node do not collide); SITE_MASTER_SUFFIX is for sites whose fast network has its own names
if [ -n "${SLURM_JOB_NODELIST:-}" ] && [ -z "${MASTER_ADDR:-}" ]; then
    MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)${SITE_MASTER_SUFFIX:-}"
    export MASTER_ADDR
fi
export MASTER_PORT=${MASTER_PORT:-$(( 20000 + ${SLURM_JOB_ID:-0} % 20000 ))}

echo "job ${SLURM_JOB_ID:-none} on ${SLURM_JOB_NODELIST:-$(hostname)}: site $WORKSHOP_SITE ($SITE_NAME)," \
     "$NPROC_PER_NODE process(es) per task, python $(command -v "$PYTHON"), module $TRAIN_MODULE"
