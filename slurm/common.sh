# Shared by every job script here: site profile, the project's Python and its checks, the
# launch command lines (slurm/launch.sh), rendezvous variables.
# Not a job script itself: the job scripts `source` it after finding the repository (ROOT).
#
# Inputs (environment; sbatch passes the submitting shell's environment to the job):
#   WORKSHOP_SITE   roihu | lumi | jureca | local | local-gpu (puhti, mahti: retired, worked
#                   examples only): slurm/sites/$WORKSHOP_SITE.sh;
#                   set, with Slurm's own SBATCH_* variables, by the site step in the shell that
#                   submits: eval "$(python -m source_code.launch.site_profiles --site S
#                   --account P --format exports)". Without it: `local` on the workshop's own
#                   test cluster, an error anywhere else (WORKSHOP_DEVICE=cpu: the CPU, said)
#   WORKSHOP_VENV   a virtual environment to activate after the site's module lines (else the
#                   venv active at submission, VIRTUAL_ENV, else the python on PATH then: a
#                   conda env, or the one the site's modules provide)
#   WORKSHOP_CONTAINER, WORKSHOP_CONTAINER_EXEC   run the launch inside a container (launch.sh)
#   TRAIN_MODULE    the Python module to run (default: source_code.training.ddp, the main job;
#                   any entry point that runs under torchrun or srun, e.g. a sharding script)
#   NPROC_PER_NODE  processes per node (default: the GPUs Slurm gave the node; on `local`, its CPUs)
#   TORCHRUN        the launcher (default: the profile's, else torchrun)
#   LAUNCHER        torchrun (default) | srun | accelerate: torchrun is needed for the first only
#
# A job without what its site needs stops here, in its first second, with one line naming the
# fix: no site set up on a cluster that is not the workshop's test cluster; a profile that
# runs on GPUs and an allocation without any; more processes per node than GPUs per node.

# ClusterName of the workshop's own test cluster (tests/slurm_cluster.py)
LOCAL_CLUSTER=workshop
SITE_STEP='eval "$(python -m source_code.launch.site_profiles --site SITE --account PROJECT --format exports)"'
if [ -z "${WORKSHOP_SITE:-}" ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_CLUSTER_NAME:-}" != "$LOCAL_CLUSTER" ]; then
    if [ "${WORKSHOP_DEVICE:-auto}" != cpu ]; then
        echo "error: no site set up for job $SLURM_JOB_ID on cluster ${SLURM_CLUSTER_NAME:-?}: run $SITE_STEP once in the shell you submit from (sites: $(cd "$ROOT/slurm/sites" && ls *.sh | sed 's/\.sh$//' | grep -v '^local' | tr '\n' ' ')), then sbatch again; WORKSHOP_DEVICE=cpu runs on the CPU without one" >&2
        exit 2
    fi
    echo "note: WORKSHOP_DEVICE=cpu and no site set up: the processes run on the CPU with the local profile (no module lines)"
fi
WORKSHOP_SITE=${WORKSHOP_SITE:-local}
profile="$ROOT/slurm/sites/$WORKSHOP_SITE.sh"
if [ ! -f "$profile" ]; then
    echo "error: no site profile $profile; set WORKSHOP_SITE to one of:" \
         $(cd "$ROOT/slurm/sites" && ls *.sh | sed 's/\.sh$//') >&2
    exit 2
fi
# shellcheck source=sites/local.sh
source "$profile"
# the GPUs Slurm gave this node: the devices it lists, else the count the job asked for
ALLOC_GPUS=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}
ALLOC_GPUS=${ALLOC_GPUS##*:}
[[ "$ALLOC_GPUS" =~ ^[0-9]+$ ]] || ALLOC_GPUS=0
# Slurm tasks a node runs: the job's --ntasks-per-node, except in a script that starts one task
# per GPU (TASK_PER_GPU=yes): one per GPU Slurm gave the node, whatever its #SBATCH line asked,
# each with its share of the node's cores (STEP_CPUS_PER_TASK; 0: fewer cores than GPUs)
TASKS_PER_NODE=${SLURM_NTASKS_PER_NODE:-1}
STEP_CPUS_PER_TASK=
if [ "${TASK_PER_GPU:-}" = yes ] && (( ALLOC_GPUS > 0 )); then
    TASKS_PER_NODE=$ALLOC_GPUS
    STEP_CPUS_PER_TASK=$(( ${SLURM_CPUS_ON_NODE:-$ALLOC_GPUS} / ALLOC_GPUS ))
fi
if [ -n "$SITE_GPU_REQUEST" ] && [ -n "${SLURM_JOB_ID:-}" ] && (( ALLOC_GPUS == 0 )) \
        && [ "${WORKSHOP_DEVICE:-auto}" != cpu ]; then
    step=${SITE_STEP/--site SITE/--site $WORKSHOP_SITE}
    [[ "$WORKSHOP_SITE" == local* ]] && step=${step/ --account PROJECT/}   # the test cluster has no accounts
    echo "error: site $WORKSHOP_SITE runs on GPUs but job $SLURM_JOB_ID was given none: submit from a shell set up with $step (or pass ${SITE_GPU_REQUEST/\{n\}/N} to sbatch); WORKSHOP_DEVICE=cpu runs on the CPU instead" >&2
    exit 2
fi
# one srun task per GPU needs a core of its own at least: fewer cores than GPUs (a shared
# partition where the job asked for the script's 2 cores) would start the tasks on shared cores
# (srun --overcommit), a starved job; WORKSHOP_DEVICE=cpu runs them so, on purpose, and says so
if [ "${STEP_CPUS_PER_TASK:-}" = 0 ] && [ "${WORKSHOP_DEVICE:-auto}" != cpu ]; then
    per=$(( SITE_GPUS_PER_NODE > 0 ? SITE_CPUS_PER_NODE / SITE_GPUS_PER_NODE : 1 ))
    (( per > ${SITE_MAX_CPUS_PER_GPU:-$per} )) && per=$SITE_MAX_CPUS_PER_GPU
    (( per < 1 )) && per=1
    tasks=${SLURM_NTASKS_PER_NODE:-1}
    echo "error: job $SLURM_JOB_ID has ${SLURM_CPUS_ON_NODE:-?} CPU core(s) for $ALLOC_GPUS GPU(s) on this node, fewer than one srun task per GPU needs (a core each; $WORKSHOP_SITE's share is $per): sbatch --cpus-per-task=$(( (per * ALLOC_GPUS + tasks - 1) / tasks )) ... for the script's $tasks task(s) a node, or the options of: python -m source_code.launch.site_profiles --site $WORKSHOP_SITE --launcher srun --format args" >&2
    exit 2
fi
# shellcheck source=launch.sh
source "$ROOT/slurm/launch.sh"
drop_inherited_memory              # a job submitted from a lab's terminal (inside another job)
site_environment
# a venv active in the shell that submitted (sbatch passes VIRTUAL_ENV on) goes in front again:
# the site's module lines put their own python3 before its bin (JURECA's Stage Python, no torch)
[ -z "${WORKSHOP_VENV:-}" ] && [ -f "${VIRTUAL_ENV:-}/bin/activate" ] && WORKSHOP_VENV=$VIRTUAL_ENV
if [ -n "${WORKSHOP_VENV:-}" ]; then
    # shellcheck disable=SC1091
    source "$WORKSHOP_VENV/bin/activate" || { echo "error: WORKSHOP_VENV=$WORKSHOP_VENV is not a venv" >&2; exit 2; }
fi
# the checks below import source_code the way the job will: from the repository
cd "$ROOT" || exit 2
# shellcheck source=launch.sh
source "$ROOT/slurm/launch.sh"
container_prefix || exit 2
PYTHON=${PYTHON:-python3}
TRAIN_MODULE=${TRAIN_MODULE:-source_code.training.ddp}
export SITE_CPU_MASKS SITE_NODE_DIRS

# torch new enough for the workshop, in the environment the training runs in (the container's
# when there is one): one line naming the fix, before any node waits for a rendezvous. The
# version comes from the package's metadata: importing torch here would cost every job about
# 2 s of CPU before its training starts.
"${IN_CONTAINER[@]}" "$PYTHON" -c '
import importlib.metadata, importlib.util, os, re, sys
spec = importlib.util.find_spec("torch")
if spec is None:
    sys.exit("error: %s cannot import torch; activate the workshop environment before sbatch "
             "(or export WORKSHOP_VENV=/path/to/venv, or load the site PyTorch module)" % sys.executable)
where = os.path.dirname(os.path.dirname(spec.origin or ""))   # the metadata beside that torch
dist = next(iter(importlib.metadata.distributions(name="torch", path=[where])), None)
if dist is not None:
    version = dist.version
else:                                   # a build without its metadata: ask torch itself
    import torch
    version = torch.__version__
if tuple(map(int, re.match(r"(\d+)\.(\d+)", version).groups())) < (2, 6):
    sys.exit("error: torch %s is too old, the workshop needs torch >= 2.6: load a newer PyTorch "
             "module (PYTORCH_MODULE=pytorch/<version>; LUMI: a newer image, LUMI_SIF=<image>) or "
             "use the workshop venv (WORKSHOP_VENV)" % version)
if importlib.util.find_spec("source_code") is None:
    sys.exit("error: cannot import source_code from %s; submit from the repository root "
             "or export WORKSHOP_ROOT" % (sys.path[0] or "."))
' || exit 2
launcher=${TORCHRUN:-${SITE_TORCHRUN:-torchrun}}
if [ "${LAUNCHER:-torchrun}" = torchrun ] && [ ${#IN_CONTAINER[@]} -eq 0 ] && ! command -v "$launcher" >/dev/null; then
    echo "error: $launcher not on PATH; activate the workshop environment" \
         "$([ "$launcher" = torchrun_jsc ] && echo "and pip install torchrun_jsc in it (or TORCHRUN=torchrun)")" >&2
    exit 2
fi

# Cores of a step's tasks. Slurm 22.05 to 23.02: srun reads SRUN_CPUS_PER_TASK, not sbatch's
# --cpus-per-task (without it every task of a step gets one core); 23.11 reads
# SLURM_CPUS_PER_TASK again, which sbatch sets. Both set here: a task per GPU (SRUN_PER_GPU)
# gets the job's cores per task. The one task per node that runs torchrun (SRUN_PER_NODE) gets
# the node's whole allocation instead (srun --cpus-per-task=$SLURM_CPUS_ON_NODE, launch.sh): on a
# node given by the site step, the job scripts' #SBATCH --cpus-per-task=2 is not what the
# node's GPUs need, and the CPU masks of bind_local_rank.sh name cores across the whole node.
[ -n "${SLURM_CPUS_PER_TASK:-}" ] && export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
srun_commands

# one process per GPU; on a CPU-only site one per allocated core
if [ -z "${NPROC_PER_NODE:-}" ]; then
    if [ -n "$SITE_GPU_REQUEST" ]; then
        NPROC_PER_NODE=$(( ALLOC_GPUS > 0 ? ALLOC_GPUS : SITE_GPUS_PER_NODE ))
    else
        NPROC_PER_NODE=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}
    fi
fi
# inside a GPU allocation one process per GPU at most (outside Slurm, the device policy's note)
procs=$(( NPROC_PER_NODE * TASKS_PER_NODE ))
if (( ALLOC_GPUS > 0 && procs > ALLOC_GPUS )) && [ "${WORKSHOP_DEVICE:-auto}" != cpu ]; then
    echo "error: $procs process(es) per node but job $SLURM_JOB_ID has $ALLOC_GPUS GPU(s) per node: one process per GPU (leave NPROC_PER_NODE and --ntasks-per-node to the job script), or ask for more GPUs" >&2
    exit 2
fi
# fewer processes than GPUs: the others idle (a first day's mistake), said once
if (( ALLOC_GPUS > 0 && procs < ALLOC_GPUS )); then
    echo "note: $procs process(es) per node for $ALLOC_GPUS GPU(s) per node: $(( ALLOC_GPUS - procs )) GPU(s) idle; one process per GPU (leave NPROC_PER_NODE and --ntasks-per-node to the job script), or ask for fewer GPUs"
fi
# fewer cores per GPU than the profile's share: the site step's sbatch function adds the share
# (--cpus-per-task) to a script of one task a node, and a task per GPU with its share to the
# srun script (--ntasks-per-node, --cpus-per-task); what it does not reach (command sbatch, a
# line's own --cpus-per-task, the lines of --format args with fewer GPUs) gets this note. No
# variable can do it: Slurm 22.05 refuses SBATCH_CPUS_PER_GPU beside a script's --cpus-per-task
# ("mutually exclusive"), 23.02.5 and newer drop it
share=$(( SITE_GPUS_PER_NODE > 0 ? SITE_CPUS_PER_NODE / SITE_GPUS_PER_NODE : 0 ))
(( share > ${SITE_MAX_CPUS_PER_GPU:-$share} )) && share=$SITE_MAX_CPUS_PER_GPU
if (( ALLOC_GPUS > 0 && share > 0 )) && [ -n "${SLURM_CPUS_ON_NODE:-}" ] \
        && (( SLURM_CPUS_ON_NODE / ALLOC_GPUS < share )); then
    echo "note: job ${SLURM_JOB_ID:-} has $SLURM_CPUS_ON_NODE CPU core(s) for $ALLOC_GPUS GPU(s) on this node, $WORKSHOP_SITE's share is $share per GPU: sbatch --cpus-per-task=$(( share * ALLOC_GPUS / ${SLURM_NTASKS_PER_NODE:-1} )) ... (or the options of: python -m source_code.launch.site_profiles --site $WORKSHOP_SITE --format args)"
fi
if [ "${WORKSHOP_DEVICE:-auto}" = cpu ] && [ -n "$SITE_GPU_REQUEST" ]; then
    echo "note: WORKSHOP_DEVICE=cpu: the processes run on the CPU on purpose ($ALLOC_GPUS GPU(s) per node allocated)"
elif [ "${SITE_GPUS_COUNTED_ONLY:-}" = yes ]; then   # the test cluster's GPUs: a count, no device
    export WORKSHOP_DEVICE=cpu
    echo "note: $SITE_NAME: Slurm gave $ALLOC_GPUS GPU(s) per node and no GPU device exists, so the processes run on the CPU with gloo"
fi
# the CPU cores of a task are shared by its processes: no oversubscription by OpenMP threads
# (one task per node: the node's whole allocation, as SRUN_PER_NODE gives it)
task_cpus=${STEP_CPUS_PER_TASK:-${SLURM_CPUS_PER_TASK:-$NPROC_PER_NODE}}
[ "$TASKS_PER_NODE" = 1 ] && task_cpus=${SLURM_CPUS_ON_NODE:-$task_cpus}
export OMP_NUM_THREADS=$(( task_cpus / NPROC_PER_NODE > 0 ? task_cpus / NPROC_PER_NODE : 1 ))

# rendezvous: the first host of the job (under its fast-network name where the profile has a
# SITE_MASTER_SUFFIX), a port derived from the job id so that two jobs sharing a node do not
# collide, below 32768 where Linux starts handing out ephemeral ports to outgoing connections
if [ -n "${SLURM_JOB_NODELIST:-}" ] && [ -z "${MASTER_ADDR:-}" ]; then
    MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)${SITE_MASTER_SUFFIX:-}"
    export MASTER_ADDR
fi
export MASTER_PORT=${MASTER_PORT:-$(( 20000 + ${SLURM_JOB_ID:-0} % 10000 ))}

echo "job ${SLURM_JOB_ID:-none} on ${SLURM_JOB_NODELIST:-$(hostname)}: site $WORKSHOP_SITE ($SITE_NAME)," \
     "$NPROC_PER_NODE process(es) per task, $ALLOC_GPUS GPU(s) per node," \
     "${STEP_CPUS_PER_TASK:-${SLURM_CPUS_PER_TASK:-?}} CPU core(s) per task," \
     "python $(command -v "$PYTHON"), module $TRAIN_MODULE" \
     "${IN_CONTAINER[*]:+, in container: ${IN_CONTAINER[*]}}"
