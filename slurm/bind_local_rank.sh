#!/bin/bash
# usage (started by torchrun --no-python, once per process of a node): bind_local_rank.sh COMMAND...
# Binds this process to CPU mask number LOCAL_RANK of SITE_CPU_MASKS (the cores next to GPU
# LOCAL_RANK: LUMI's documented masks), then execs COMMAND. torchrun itself cannot bind its
# processes; srun can (--cpu-bind=mask_cpu) only when it starts them itself.
# No binding, said in one line, unless the node runs one process per mask (a whole node).
IFS=, read -r -a masks <<< "${SITE_CPU_MASKS:-}"
rank=${LOCAL_RANK:-0}
if [ "${#masks[@]}" -eq 0 ] || [ "${LOCAL_WORLD_SIZE:-0}" != "${#masks[@]}" ]; then
    [ "$rank" = 0 ] && echo "bind_local_rank: ${LOCAL_WORLD_SIZE:-?} processes on $(hostname)," \
                            "${#masks[@]} CPU masks: not a whole node, no CPU binding"
    exec "$@"
fi
# the mask as a core list (hex digit i holds cores 4i..4i+3): 0xfe -> 1,2,3,4,5,6,7
hex=${masks[$rank]#0x}
cores=""
for (( i = 0; i < ${#hex}; i++ )); do
    digit=$(( 16#${hex:${#hex}-1-i:1} ))
    for bit in 0 1 2 3; do
        (( digit >> bit & 1 )) && cores+="${cores:+,}$(( 4 * i + bit ))"
    done
done
if ! command -v taskset >/dev/null; then
    [ "$rank" = 0 ] && echo "bind_local_rank: taskset not found, no CPU binding"
    exec "$@"
fi
exec taskset -c "$cores" "$@"
