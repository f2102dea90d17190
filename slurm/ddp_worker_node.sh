#!/bin/bash
# The master/worker exercise, part 2: a WORKER node. It waits for the master's "host port job"
# line in RDZV_FILE (shared storage), ignores a line left by a master job that is no longer
# running, and joins the master's rendezvous. No master within MASTER_WAIT seconds: a clear
# error (exit 3).
#
#   sbatch slurm/ddp_worker_node.sh         (after sbatch slurm/ddp_master_node.sh)
#   bash slurm/ddp_worker_node.sh           (by hand, on another node than the master)
#
#   NNODES       nodes in the job, master included (default 2)
#   RDZV_FILE    where the master published host:port (default ~/.workshop/master-node.txt)
#   MASTER_WAIT  seconds to wait for a master (default 300)
#SBATCH --job-name=ddp-worker
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:15:00
#SBATCH --output=%x-%j.out

# find the repository: sbatch runs a copy of this script, so $0 does not tell where it is
for ROOT in "${WORKSHOP_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-.}/.." "$PWD" "$(dirname "$0")/.."; do
    [ -f "$ROOT/slurm/common.sh" ] && break
done
[ -f "$ROOT/slurm/common.sh" ] || { echo "error: workshop repository not found; submit from its root or export WORKSHOP_ROOT=/path/to/it" >&2; exit 2; }
source "$ROOT/slurm/common.sh"

RDZV_FILE=${RDZV_FILE:-$HOME/.workshop/master-node.txt}
MASTER_WAIT=${MASTER_WAIT:-300}
start=$SECONDS
while :; do
    if [ -s "$RDZV_FILE" ] && read -r HOST PORT JOB < "$RDZV_FILE"; then
        # a line from a master job that is not running any more is stale: keep waiting
        if [ "$JOB" = none ] || squeue -h -t RUNNING -j "$JOB" 2>/dev/null | grep -q .; then
            break
        fi
    fi
    if (( SECONDS - start >= MASTER_WAIT )); then
        echo "error: no master found: $RDZV_FILE names no running master after ${MASTER_WAIT}s;" \
             "start slurm/ddp_master_node.sh first (same RDZV_FILE), or raise MASTER_WAIT" >&2
        exit 3
    fi
    sleep 1
done
is_host=""; [ "${RDZV_IS_HOST:-${SITE_RDZV_IS_HOST:-no}}" = yes ] && is_host=",is_host=0"
echo "worker on $(hostname): joining master $HOST:$PORT (job $JOB)"
"${IN_CONTAINER[@]}" "$launcher" --nnodes="${NNODES:-2}" --nproc-per-node="$NPROC_PER_NODE" \
    --rdzv-backend=c10d --rdzv-endpoint="$HOST:$PORT" --rdzv-id="master-$PORT" \
    --rdzv-conf=join_timeout="${JOIN_TIMEOUT:-600}"$is_host \
    -m "$TRAIN_MODULE" "$@"
