"""The one device policy (source_code/device_policy.py), with the GPUs described by hand.

Every rule is checked without a GPU: ``choose`` takes what torch would report as a ``Gpus``
value, and the environment as a dict, so the GPU-node cases run on a laptop and in CI.
"""
import pytest
import torch

from source_code.device_policy import (MIXED, DeviceError, Gpus, build_runs_on, choose,
                                       gpus_announced, local_world_size)

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


def test_srun_with_one_gpu_per_task_uses_cuda0_in_every_task():
    env = {"SLURM_GPUS_PER_TASK": "1"}
    for local_rank in range(4):
        assert choose(local_rank, 4, env=env, gpus=ONE_GPU).device == torch.device("cuda", 0)
    # LUMI's select-GPU wrapper: ROCR_VISIBLE_DEVICES=$SLURM_LOCALID in each task
    assert choose(3, 8, env={"ROCR_VISIBLE_DEVICES": "3"}, gpus=ONE_GPU).device.type == "cuda"


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
