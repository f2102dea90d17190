#!/bin/bash
# The master/worker exercise, part 1: the MASTER node. It hosts the rendezvous and publishes
# "host port job" in RDZV_FILE on shared storage; ddp_worker_node.sh on another node reads it,
# so nobody pastes an IP address. Start it as a job or by hand on a node you hold:
#
#   sbatch slurm/ddp_master_node.sh         and then    sbatch slurm/ddp_worker_node.sh
#   bash slurm/ddp_master_node.sh           and on another node    bash slurm/ddp_worker_node.sh
#
#   NNODES       nodes in the job, master included (default 2)
#   RDZV_FILE    where host:port is published (default ~/.workshop/master-node.txt)
#   JOIN_TIMEOUT seconds the master waits for its workers (default 600)
#SBATCH --job-name=ddp-master
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
HOST=$(hostname)${SITE_MASTER_SUFFIX:-}
PORT=$("$PYTHON" -c "from source_code.distributed import free_port; print(free_port())")
mkdir -p "$(dirname "$RDZV_FILE")"
trap 'rm -f "$RDZV_FILE"' EXIT      # a finished master leaves no stale address behind
echo "$HOST $PORT ${SLURM_JOB_ID:-none}" > "$RDZV_FILE.tmp" && mv "$RDZV_FILE.tmp" "$RDZV_FILE"
# where torchrun cannot recognise its own (InfiniBand) host name: the master hosts the store
is_host=""; [ "${RDZV_IS_HOST:-${SITE_RDZV_IS_HOST:-no}}" = yes ] && is_host=",is_host=1"
echo "master: rendezvous at $HOST:$PORT, published in $RDZV_FILE; waiting for $((${NNODES:-2} - 1)) worker node(s)"
"${IN_CONTAINER[@]}" "$launcher" --nnodes="${NNODES:-2}" --nproc-per-node="$NPROC_PER_NODE" \
    --rdzv-backend=c10d --rdzv-endpoint="$HOST:$PORT" --rdzv-id="master-$PORT" \
    --rdzv-conf=join_timeout="${JOIN_TIMEOUT:-600}"$is_host \
    -m "$TRAIN_MODULE" "$@"
