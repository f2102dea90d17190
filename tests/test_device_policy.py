"""The one device policy (source_code/device_policy.py), with the GPUs described by hand.

Every rule is checked without a GPU: ``choose`` takes what torch would report as a ``Gpus``
value, and the environment as a dict, so the GPU-node cases run on a laptop and in CI.
"""
import pytest
import torch

from source_code.device_policy import (MIXED, DeviceError, Gpus, build_runs_on, choose, decide,
                                       gpus_announced, job_placements, local_world_size,
                                       node_placements, placement_from, view_of)

H100 = Gpus(True, count=4, capability=(9, 0), name="NVIDIA H100",
            arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"))
V100_ON_CUDA13 = Gpus(True, count=4, capability=(7, 0), name="Tesla V100",
                      arch_list=("sm_75", "sm_80", "sm_90", "sm_100", "sm_120"))
ONE_GPU = Gpus(True, count=1, capability=(8, 6), name="RTX 3090", arch_list=("sm_80", "sm_90"))
NO_GPU = Gpus(False)


def test_laptop_without_gpu_uses_gloo_on_cpu():
    placed = choose(0, 4, env={}, gpus=NO_GPU)
    assert (placed.device, placed.backend, placed.note) == (torch.device("cpu"), "gloo", "")


def test_one_process_per_gpu_gets_its_own_gpu_and_the_mixed_backend():
    for local_rank in range(4):
        placed = choose(local_rank, 4, env={}, gpus=H100)
        assert placed.device == torch.device("cuda", local_rank)
        assert placed.backend == MIXED == "cpu:gloo,cuda:nccl"


def test_more_processes_than_gpus_falls_back_to_cpu_with_one_line():
    placed = choose(1, 4, env={}, gpus=ONE_GPU)
    assert (placed.device.type, placed.backend) == ("cpu", "gloo")
    assert "4 processes on this node but 1 GPU" in placed.note and "\n" not in placed.note
    assert "--nproc-per-node=1" in placed.note


def test_cpu_on_purpose_wins_even_on_a_gpu_node():
    placed = choose(0, 1, env={"WORKSHOP_DEVICE": "cpu", "SLURM_GPUS_ON_NODE": "4"}, gpus=H100)
    assert (placed.device.type, placed.backend) == ("cpu", "gloo")


@pytest.mark.parametrize("env", [{"SLURM_GPUS_ON_NODE": "4"}, {"CUDA_VISIBLE_DEVICES": "0,1"},
                                 {"ROCR_VISIBLE_DEVICES": "0"}, {"WORKSHOP_DEVICE": "cuda"}])
def test_gpu_node_whose_cuda_does_not_start_is_an_error_naming_the_fix(env):
    with pytest.raises(DeviceError) as err:
        choose(0, 1, env=env, gpus=NO_GPU)
    msg = err.value.message
    assert "cannot start CUDA" in msg and "site's PyTorch module" in msg and "\n" not in msg
    assert err.value.code == 2


@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "-1"},
                                 {"SLURM_GPUS_ON_NODE": "0"}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}])
def test_no_gpu_announced_is_a_plain_cpu_run(env):
    assert gpus_announced(env) == ""
    assert choose(0, 2, env=env, gpus=NO_GPU).device.type == "cpu"


def test_gpu_the_build_cannot_run_is_an_error_naming_the_fix():
    with pytest.raises(DeviceError) as err:
        choose(0, 4, env={}, gpus=V100_ON_CUDA13)
    assert "Tesla V100 (sm_70) is not supported" in err.value.message
    assert "CUDA 12.x for sm_70" in err.value.message


@pytest.mark.parametrize("capability,arches,ok", [
    ((9, 0), ("sm_80", "sm_90"), True),
    ((8, 6), ("sm_80",), True),            # same major, newer minor: binary compatible
    ((8, 0), ("sm_86",), False),           # older minor: no
    ((7, 0), ("sm_75", "sm_80"), False),   # V100 on a CUDA 13 build
    ((12, 0), ("sm_90", "compute_90"), True),  # PTX is compiled for newer GPUs at load time
    ((7, 0), ("compute_75",), False),
])
def test_build_runs_on(capability, arches, ok):
    assert build_runs_on(capability, arches) is ok


def test_local_world_size_from_each_launcher():
    assert local_world_size({"LOCAL_WORLD_SIZE": "4"}, 8) == 4
    srun = {"SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_TASKS_PER_NODE": "4,2", "SLURM_NODEID": "1"}
    assert local_world_size(srun, 6) == 2
    srun = {"SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"}
    assert local_world_size(srun, 8) == 4
    assert local_world_size({}, 3) == 3


def test_this_machine_follows_the_policy():
    placed = choose(0, 1)
    if torch.cuda.is_available():
        assert (placed.device.type, placed.backend) == ("cuda", MIXED)
    else:
        assert (placed.device.type, placed.backend) == ("cpu", "gloo")


# ------------------------------------------------------------ one decision for a node and a job
def node_gpus(n: int) -> list[str]:
    return [f"GPU-{i:04d}-uuid" for i in range(n)]


def sees(*uuids: str, gpus: Gpus = H100) -> Gpus:
    """What torch shows a process that sees these physical GPUs."""
    return Gpus(True, len(uuids), gpus.capability, gpus.name, gpus.arch_list, gpus.hip, tuple(uuids))


def devices(placed) -> list[str]:
    return [str(p.device) for p in placed]


def test_lumi_select_gpu_wrapper_gives_every_rank_its_own_gcd():
    """ROCR_VISIBLE_DEVICES=$SLURM_LOCALID: each of 8 ranks sees one GCD, local rank 0 too."""
    gcds = node_gpus(8)
    envs = [{"ROCR_VISIBLE_DEVICES": str(i), "SLURM_GPUS_ON_NODE": "8"} for i in range(8)]
    placed = node_placements(envs, [sees(g) for g in gcds])
    assert devices(placed) == ["cuda:0"] * 8 and {p.backend for p in placed} == {MIXED}


def test_map_gpu_ids_in_any_order_use_the_one_gpu_each_rank_sees():
    """srun --gpu-bind=map_gpu:3,2,1,0 (or =closest): one GPU per task whose id is not its rank."""
    uuids = node_gpus(4)
    envs = [{"CUDA_VISIBLE_DEVICES": str(g)} for g in (3, 2, 1, 0)]
    placed = node_placements(envs, [sees(uuids[g]) for g in (3, 2, 1, 0)])
    assert devices(placed) == ["cuda:0"] * 4 and not any(p.note for p in placed)
    # without UUIDs (old drivers) the single visible id tells the GPUs apart
    placed = node_placements(envs, [Gpus(True, 1, (9, 0), "H100", H100.arch_list)] * 4)
    assert devices(placed) == ["cuda:0"] * 4


def test_two_ranks_that_see_the_same_single_gpu_both_go_to_the_cpu():
    """CUDA_VISIBLE_DEVICES=1 and 2 processes: both see GPU 1; NCCL would fail on a duplicate GPU."""
    uuid = node_gpus(2)[1]
    placed = node_placements([{"CUDA_VISIBLE_DEVICES": "1"}] * 2, [sees(uuid)] * 2)
    assert devices(placed) == ["cpu", "cpu"] and {p.backend for p in placed} == {"gloo"}
    assert "2 processes on this node but 1 GPU" in placed[0].note


def test_four_gpu_node_with_four_ranks_and_with_eight():
    uuids = node_gpus(4)
    placed = node_placements([{}] * 4, [sees(*uuids)] * 4)
    assert devices(placed) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    placed = node_placements([{}] * 8, [sees(*uuids)] * 8)
    assert devices(placed) == ["cpu"] * 8
    assert "8 processes on this node but 4 GPU(s)" in placed[0].note and "--nproc-per-node=4" in placed[0].note


def test_torchrun_children_of_one_slurm_task_share_what_the_task_holds():
    """srun --ntasks-per-node=1 torchrun --nproc-per-node=4: the children see the task's GPUs."""
    uuids = node_gpus(4)
    env = {"SLURM_GPUS_PER_TASK": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert devices(node_placements([env] * 4, [sees(*uuids)] * 4)) == [f"cuda:{i}" for i in range(4)]
    # the same task holding one GPU: SLURM_GPUS_PER_TASK does not make four GPUs out of one
    env = {"SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "0"}
    assert devices(node_placements([env] * 4, [sees(uuids[0])] * 4)) == ["cpu"] * 4


def test_ranks_of_a_node_that_see_different_things_get_one_error():
    envs = [{"ROCR_VISIBLE_DEVICES": str(i)} for i in range(2)]
    with pytest.raises(DeviceError, match=r"local rank\(s\) 0 see no GPU while local rank\(s\) 1 do"):
        node_placements(envs, [NO_GPU, sees(node_gpus(2)[1])])
    with pytest.raises(DeviceError, match="ask for different devices"):
        node_placements([{"WORKSHOP_DEVICE": "cpu"}, {}], [sees(*node_gpus(2))] * 2)


def test_the_job_gets_one_kind_of_device():
    uuids = node_gpus(4)
    full = ([0, 1], [{}] * 2, [sees(*uuids[:2])] * 2)
    short = ([2, 3], [{}] * 2, [sees(uuids[0])] * 2)  # this node's two ranks see one GPU
    assert devices(job_placements({"n1": full, "n2": ([2, 3], [{}] * 2, [sees(*uuids[2:])] * 2)})) == \
        ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    placed = job_placements({"n1": full, "n2": short})
    assert devices(placed) == ["cpu"] * 4 and "2 processes on this node but 1 GPU" in placed[0].note
    with pytest.raises(DeviceError, match=r"\(node n2\)"):
        job_placements({"n1": full, "n2": ([2, 3], [{"SLURM_GPUS_ON_NODE": "2"}] * 2, [NO_GPU] * 2)})


def test_views_travel_as_json_and_every_rank_reads_the_same_answer():
    """What distributed.place sends through the store: each rank's view, rank 0's answer."""
    uuids = node_gpus(8)
    views = [view_of(i % 4, {"SLURMD_NODENAME": f"n{i // 4 + 1}", "ROCR_VISIBLE_DEVICES": str(i % 4)},
                     sees(uuids[i])) for i in range(8)]
    answer = decide(views)
    assert [str(placement_from(answer, r).device) for r in range(8)] == ["cuda:0"] * 8
    broken = decide([view_of(0, {"SLURMD_NODENAME": "n1", "SLURM_GPUS_ON_NODE": "1"}, NO_GPU)] * 2)
    for rank in range(2):
        with pytest.raises(DeviceError, match="cannot start CUDA"):
            placement_from(broken, rank)


def test_an_srun_task_alone_trusts_the_gpu_slurm_gave_it_but_torchrun_children_do_not():
    """Without an exchange (a framework under srun forms its own group), an srun task that sees
    one GPU given per task uses it; torchrun's children of one task with one GPU must not."""
    one = sees(node_gpus(1)[0])
    task = {"SLURM_STEP_NUM_TASKS": "8", "SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "0"}
    assert str(choose(3, 8, env=task, gpus=one).device) == "cuda:0"
    lumi = {"SLURM_STEP_NUM_TASKS": "8", "ROCR_VISIBLE_DEVICES": "5"}
    assert str(choose(5, 8, env=lumi, gpus=one).device) == "cuda:0"
    children = {**task, "TORCHELASTIC_RUN_ID": "42"}
    assert choose(2, 4, env=children, gpus=one).device.type == "cpu"


def test_a_hand_exported_visible_devices_in_a_slurm_gpu_allocation_is_refused():
    """export CUDA_VISIBLE_DEVICES=0 in a job that Slurm gave 4 GPUs: 4 tasks see one; no CPU run."""
    uuid = node_gpus(4)[0]
    envs = [{"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0", "SLURM_LOCALID": str(i)} for i in range(4)]
    with pytest.raises(DeviceError) as err:
        node_placements(envs, [sees(uuid)] * 4)
    message = err.value.message
    assert "\n" not in message and "Slurm gave this node 4 GPU(s) for 4 processes" in message
    assert "do not export CUDA_VISIBLE_DEVICES" in message and "WORKSHOP_DEVICE=cpu" in message
    # on purpose on the CPU: allowed; more processes than the allocation's GPUs: the CPU note, as before
    assert devices(node_placements([{**e, "WORKSHOP_DEVICE": "cpu"} for e in envs], [sees(uuid)] * 4)) == ["cpu"] * 4
    placed = node_placements([{"SLURM_GPUS_ON_NODE": "1", "CUDA_VISIBLE_DEVICES": "0"}] * 2, [sees(uuid)] * 2)
    assert devices(placed) == ["cpu", "cpu"] and "2 processes on this node but 1 GPU" in placed[0].note
