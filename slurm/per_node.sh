#!/bin/bash
# usage (started by srun on every node of a job): per_node.sh COMMAND [ARG...]
# What has to happen on each node before the training starts there, then exec COMMAND:
# * the directories in SITE_NODE_DIRS exist: node-local caches on /tmp (LUMI's MIOpen cache)
#   that the batch script, which runs on the first node only, cannot create for the others;
# * @IS_HOST@ in an argument becomes 1 on the job's first node and 0 on the others: torchrun's
#   --rdzv-conf=is_host=..., where torchrun cannot tell by its host name which node hosts the
#   rendezvous store (JSC's InfiniBand host names, pytorch/pytorch#73656);
# * @NODE_RANK@ becomes this node's SLURM_NODEID (accelerate launch --machine_rank): read here,
#   in each node's task, not by the batch script, where it is always 0.
for dir in ${SITE_NODE_DIRS:-}; do
    mkdir -p "$dir" || { echo "error: cannot create $dir on $(hostname)" >&2; exit 2; }
done
is_host=$(( ${SLURM_NODEID:-0} == 0 ? 1 : 0 ))
args=()
for arg in "$@"; do
    arg=${arg//@IS_HOST@/$is_host}
    args+=("${arg//@NODE_RANK@/${SLURM_NODEID:-0}}")
done
exec "${args[@]}"
