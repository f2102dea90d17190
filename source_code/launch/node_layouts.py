"""Which process gets which GPU on a real node: the layouts of the sites' job scripts, decided
by ``device_policy.node_placements`` exactly as the ranks of a job decide (no GPU needed).

    python -m source_code.launch.node_layouts

Each layout gives every local rank the variables Slurm and the job script set for it and what
torch would show it (``Gpus``: how many devices, which physical ones by UUID). The table says
which device each rank takes, how many of the node's GPUs the job uses, and the policy's note or
error where the layout is wrong. Two ways are right on a GPU node: one torchrun per node whose
workers all see every GPU (``cuda:LOCAL_RANK``), or one Slurm task per GPU: bound by srun, each
sees only its own (``cuda:0`` in every task, a different GPU behind each); unbound, as in the
workshop's srun script, each sees them all and takes ``cuda:SLURM_LOCALID``.
"""
from __future__ import annotations

from dataclasses import dataclass

from source_code.device_policy import DeviceError, Gpus, node_placements

A100 = Gpus(True, 1, (8, 0), "NVIDIA A100-SXM4-40GB", ("sm_80", "sm_90"))
MI250X = Gpus(True, 1, (9, 0), "AMD Instinct MI250X", ("gfx90a",), hip=True)


@dataclass(frozen=True)
class Layout:
    name: str
    how: str               # the lines of the job script that make it
    envs: tuple            # one environment per local rank
    seen: tuple            # one tuple of physical GPU ids per local rank (what torch shows it)
    gpus_on_node: int
    gpu: Gpus = A100


@dataclass(frozen=True)
class Row:
    layout: Layout
    devices: tuple         # the device each local rank computes on ("error" if refused)
    used: int              # physical GPUs some rank computes on
    message: str           # the policy's note or error line ("" when all is well)


def _gpus(kind: Gpus, ids) -> Gpus:
    return Gpus(True, len(ids), kind.capability, kind.name, kind.arch_list, kind.hip,
                tuple(f"GPU-{i}" for i in ids))


def layouts() -> list[Layout]:
    four, eight = tuple(range(4)), tuple(range(8))
    lumi = {"SLURM_GPUS_ON_NODE": "8"}
    jureca = {"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    return [
        Layout("torchrun per node (JURECA)", "--gres=gpu:4; one Slurm task per node runs torchrun "
               "--nproc-per-node=4", tuple({**jureca, "LOCAL_RANK": str(i)} for i in four), (four,) * 4, 4),
        Layout("one task per GPU, bound by srun (JURECA)", "srun --ntasks-per-node=4 --gpus-per-task=1",
               tuple({"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_TASK": "1", "SLURM_LOCALID": str(i),
                      "SLURM_STEP_NUM_TASKS": "4", "CUDA_VISIBLE_DEVICES": "0"} for i in four),
               tuple((i,) for i in four), 4),
        Layout("one task per GPU, unbound (the workshop's srun script)", "--gres=gpu:4; srun "
               "--ntasks-per-node=4 python ...  (no GPU binding: every task sees the node's 4)",
               tuple({**jureca, "SLURM_LOCALID": str(i), "SLURM_STEP_NUM_TASKS": "4"} for i in four),
               (four,) * 4, 4),
        Layout("torchrun per node (LUMI)", "--gpus-per-node=8; one Slurm task per node runs torchrun "
               "--nproc-per-node=8", tuple({**lumi, "LOCAL_RANK": str(i)} for i in eight), (eight,) * 8, 8,
               MI250X),
        Layout("one task per GCD, select-GPU wrapper (LUMI)", "--gpus-per-node=8; srun --ntasks-per-node=8 "
               "select_gpu python ...  (ROCR_VISIBLE_DEVICES=$SLURM_LOCALID)",
               tuple({**lumi, "SLURM_LOCALID": str(i), "ROCR_VISIBLE_DEVICES": str(i)} for i in eight),
               tuple((i,) for i in eight), 8, MI250X),
        Layout("wrong: one python process for 4 GPUs", "--gres=gpu:a100:4; python train.py",
               ({**jureca},), (four,), 4),
        Layout("wrong: CUDA_VISIBLE_DEVICES=0 exported for every task", "export CUDA_VISIBLE_DEVICES=0; "
               "srun --ntasks-per-node=4 python ...",
               tuple({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0", "SLURM_LOCALID": str(i)}
                     for i in four), ((0,),) * 4, 4),
        Layout("wrong: one rank started without the wrapper (LUMI)", "srun ... select_gpu python ..., "
               "but local rank 7 gets ROCR_VISIBLE_DEVICES= (empty: no GCD)",
               tuple({**lumi, "ROCR_VISIBLE_DEVICES": str(i) if i < 7 else ""} for i in eight),
               tuple((i,) if i < 7 else () for i in eight), 8, MI250X),
    ]


def decide(layout: Layout) -> Row:
    views = [_gpus(layout.gpu, ids) if ids else Gpus(False) for ids in layout.seen]
    try:
        placed = node_placements(list(layout.envs), views)
    except DeviceError as err:
        return Row(layout, ("error",) * len(layout.envs), 0, err.message)
    devices = tuple(str(p.device) for p in placed)
    used = len({ids[p.device.index] for ids, p in zip(layout.seen, placed) if p.device.type == "cuda"})
    message = next((p.note for p in placed if p.note), "")
    if not message and used < layout.gpus_on_node:
        message = (f"note: {len(placed)} process(es) on a node with {layout.gpus_on_node} GPUs: "
                   f"{layout.gpus_on_node - used} of them idle")
    return Row(layout, devices, used, message)


def table() -> list[Row]:
    return [decide(layout) for layout in layouts()]


def show(rows) -> None:
    for r in rows:
        devices = ", ".join(r.devices) if len(set(r.devices)) > 1 else f"{r.devices[0]} x {len(r.devices)}"
        print(f"{r.layout.name}\n    {r.layout.how}\n    ranks compute on: {devices}; "
              f"GPUs used {r.used} of {r.layout.gpus_on_node}")
        if r.message:
            print(f"    {r.message}")


if __name__ == "__main__":
    show(table())
