"""The resource calculator and the site profiles: the rules of thumb, computed and checked."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from source_code.launch import site_profiles as sp
from source_code.launch import site_step

ROOT = sp.SITES_DIR.parents[1]


def opts(site, gpus, launcher="torchrun"):
    return dict(o.lstrip("-").split("=", 1) for o in sp.args(site, gpus, launcher))


def test_every_required_site_has_a_profile():
    assert {"roihu", "puhti", "mahti", "lumi", "jureca", "local"} <= set(sp.sites())
    for key in sp.sites():
        site = sp.load(key)
        assert site.partition and site.gpus_per_node > 0 and site.environment


@pytest.mark.parametrize("site,gres", [("puhti", "gres=gpu:v100:4"), ("mahti", "gres=gpu:a100:4"),
                                       ("roihu", "gres=gpu:gh200:4"),
                                       ("jureca", "gres=gpu:4"), ("lumi", "gpus-per-node=8")])
def test_gpu_request_syntax_per_site(site, gres):
    gpus = sp.load(site).gpus_per_node
    flags = sp.args(site, gpus)
    assert f"--{gres}" in flags


def test_lumi_16_gcds_two_whole_nodes_seven_cores_and_60gb_each():
    o = opts("lumi", 16)
    assert (o["partition"], o["nodes"], o["ntasks-per-node"]) == ("standard-g", "2", "1")
    assert (o["cpus-per-task"], o["mem"]) == (str(7 * 8), f"{60 * 8}G")
    o = opts("lumi", 16, "srun")
    assert (o["ntasks-per-node"], o["cpus-per-task"]) == ("8", "7")


def test_share_of_the_node_follows_the_share_of_gpus():
    for key in ("puhti", "mahti", "lumi"):
        site = sp.load(key)
        o = opts(key, 2, "srun")
        assert int(o["cpus-per-task"]) * site.gpus_per_node <= site.cpus_per_node
        assert int(o["mem"].rstrip("G")) <= site.mem_per_node_gb // 2
    assert opts("puhti", 1)["cpus-per-task"] == "10"  # 40 cores / 4 GPUs
    assert "mem" not in opts("jureca", 4)  # whole nodes: no memory request


def test_partition_follows_the_gpu_count_and_test_runs_have_their_own():
    assert opts("mahti", 2)["partition"] == "gpusmall"
    assert opts("mahti", 8)["partition"] == "gpumedium"
    with pytest.raises(sp.ProfileError, match="gpumedium takes whole nodes of 4 GPUs; use 2 or 4"):
        sp.args("mahti", 3)
    assert (opts("lumi", 7)["partition"], opts("lumi", 8)["partition"]) == ("small-g", "standard-g")
    assert sp.args("puhti", 8, test=True, time="00:15:00")[0] == "--partition=gputest"
    with pytest.raises(sp.ProfileError, match="gputest takes at most 8 GPUs for 15 min"):
        sp.args("puhti", 4, test=True, time="00:20:00")
    with pytest.raises(sp.ProfileError, match="not a Slurm time"):
        sp.args("puhti", 4, time="half an hour")


def test_gpu_count_that_does_not_fill_nodes_is_a_clear_error():
    with pytest.raises(sp.ProfileError, match="use 4 or 8"):
        sp.args("puhti", 6)
    with pytest.raises(sp.ProfileError, match="unknown site 'nowhere'; choose one of"):
        sp.load("nowhere")


def test_command_line_prints_the_header():
    res = subprocess.run([sys.executable, "-m", "source_code.launch.site_profiles", "--site", "lumi",
                          "--gpus", "16"], capture_output=True, text=True, check=True)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --nodes=2" in [ln.split("  #")[0].rstrip() for ln in lines]
    assert "SBATCH_ACCOUNT" in res.stdout and "--account" not in "".join(lines)
    bad = subprocess.run([sys.executable, "-m", "source_code.launch.site_profiles", "--site", "puhti",
                          "--gpus", "5"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_no_accounts_reservations_personal_paths_or_ips_in_slurm_files():
    files = [p for p in (ROOT / "slurm").rglob("*") if p.is_file()]
    assert len(files) >= 10
    for p in files:
        text = p.read_text()
        assert not re.search(r"^#SBATCH\s+(-A|--account|--reservation)", text, re.M), p
        assert not re.search(r"project_\d+|/users/|/home/\w|/scratch/\w", text), p
        # no machine's address (0.0.0.0, "every interface", is none)
        assert not re.search(r"\b(?!0\.0\.0\.0\b)\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", text), p


def test_profiles_are_valid_shell_with_a_site_environment_function():
    for key in sp.sites():
        res = subprocess.run(["bash", "-n", str(sp.SITES_DIR / f"{key}.sh")], capture_output=True)
        assert res.returncode == 0, key
        res = subprocess.run(["bash", "-c", f"source {sp.SITES_DIR / key}.sh && type site_environment "
                              "&& echo $SITE_GPUS_PER_NODE"], capture_output=True, text=True)
        assert res.stdout.split()[-1] == str(sp.load(key).gpus_per_node), key


# The sites' documented limits, typed in from their user guides (not from the profiles), so that
# a profile edit that breaks one fails here. GiB: Slurm's "G" suffix is GiB.
# Puhti, Mahti: https://docs.csc.fi/computing/running/batch-job-partitions/ ("Puhti GPU
#   partitions": gpu 3 days, 80 GPUs, 20 nodes, 373 GiB per node; gputest 15 min, 8 GPUs,
#   2 nodes; at most 10 cores per GPU. "Mahti GPU partitions": gputest 15 min, 4 GPUs, 1 node;
#   gpusmall 36 h, 2 GPUs, 1 node; gpumedium 36 h, 24 GPUs, 6 nodes; 490 GiB per node, 122.5 GiB
#   allocated per GPU; at most 32 cores per GPU).
# LUMI: https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/partitions/ (standard-g
#   2 days, 1024 nodes, whole nodes; small-g 3 days, 4 nodes; dev-g 3 h, 32 nodes);
#   https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/distribution-binding/ ("Only 56
#   cores available on LUMI-G", 8 GCDs per node); memory: the LUMI AI Guide's job scripts,
#   https://github.com/Lumi-supercomputer/LUMI-AI-Guide/tree/main/05-multi-gpu-and-node
#   (--mem=480G for a whole node, --mem-per-gpu=60G).
# Roihu: https://docs.csc.fi/computing/running/batch-job-partitions/ ("Roihu GPU partitions":
#   gputest 15 min, 1-2 nodes, 4 GPUs a node; gpumedium 36 h, 1-4 nodes, 4 GPUs a job; gpularge
#   36 h, 1-10 nodes, 4 GPUs a node, after a scalability test; each reserved GPU up to 72 cores and
#   217 GiB, allocation type G: both fixed by the GPU count); creating-job-scripts-roihu.md
#   (--gres=gpu:gh200:<GPUs per node>); apps/pytorch.md (module python-pytorch on Roihu-GPU).
# JURECA-DC: whole nodes of 4 GPUs (--gres=gpu:4) and 128 cores, as in JSC's course job scripts,
#   https://github.com/HelmholtzAI-FZJ/2025-12-course-Bringing-Deep-Learning-Workloads-to-JSC-supercomputers
LIMITS = {
    "puhti": {"gpus_per_node": 4, "cores_per_gpu": 10, "cores_per_node": 40,
              "partitions": {"gpu": (80, 20, 3 * 24 * 60, 373), "gputest": (8, 2, 15, 373)}},
    "mahti": {"gpus_per_node": 4, "cores_per_gpu": 32, "cores_per_node": 128, "mem_per_gpu": 122.5,
              "partitions": {"gpusmall": (2, 1, 36 * 60, 490), "gpumedium": (24, 6, 36 * 60, 490),
                             "gputest": (4, 1, 15, 490)}},
    "lumi": {"gpus_per_node": 8, "cores_per_gpu": 7, "cores_per_node": 56, "mem_per_gpu": 60,
             "partitions": {"standard-g": (8 * 1024, 1024, 2 * 24 * 60, 480),
                            "small-g": (8 * 4, 4, 3 * 24 * 60, 480), "dev-g": (8 * 32, 32, 180, 480)}},
    "roihu": {"gpus_per_node": 4, "cores_per_gpu": 72, "cores_per_node": 288,
              "partitions": {"gpumedium": (4, 4, 36 * 60, None, "GPUs a job"), "gpularge": (40, 10, 36 * 60, None),
                             "gputest": (8, 2, 15, None)}},
    "jureca": {"gpus_per_node": 4, "cores_per_gpu": 32, "cores_per_node": 128,
               "partitions": {"dc-gpu": (None,) * 4, "dc-gpu-devel": (None,) * 4}},
}


def headers(site):
    """Every header the calculator writes for `site`: GPU counts up to 4 nodes, both launchers,
    plus the test partition with its longest time."""
    per = sp.load(site).gpus_per_node
    cases = [(g, la, False, "00:30:00") for g in (*range(1, per + 1), 2 * per, 4 * per)
             for la in ("torchrun", "srun")]
    test = sp.load(site)
    cases.append((min(per, test.test_max_gpus), "torchrun", True, f"{test.test_max_minutes}"))
    out = []
    for gpus, launcher, is_test, time in cases:
        try:
            out.append((gpus, dict(o.lstrip("-").split("=", 1)
                                   for o in sp.args(site, gpus, launcher, time, test=is_test))))
        except sp.ProfileError as err:  # a refused size names the sizes that fit
            assert re.search(r"use \d+ or \d+", err.message), err.message
    return out


@pytest.mark.parametrize("site", sorted(LIMITS))
def test_generated_headers_stay_within_the_documented_limits(site):
    lim = LIMITS[site]
    for gpus, o in headers(site):
        nodes, tasks = int(o["nodes"]), int(o["ntasks-per-node"])
        per_node = gpus // nodes
        assert per_node <= lim["gpus_per_node"] and nodes * per_node == gpus, (site, gpus, o)
        cores = int(o["cpus-per-task"]) * tasks
        assert cores <= lim["cores_per_node"] and cores <= lim["cores_per_gpu"] * per_node, (site, gpus, o)
        assert o["partition"] in lim["partitions"], (site, gpus, o)
        max_gpus, max_nodes, max_minutes, max_mem = lim["partitions"][o["partition"]][:4]
        if max_gpus is not None:
            assert gpus <= max_gpus and nodes <= max_nodes, (site, gpus, o)
            assert sp.minutes(o["time"]) <= max_minutes, (site, gpus, o)
        if "mem" in o:
            mem = int(o["mem"].rstrip("G"))
            assert max_mem is not None and mem <= max_mem, (site, gpus, o)
            assert mem / per_node <= lim.get("mem_per_gpu", mem), (site, gpus, o)
        else:
            # whole nodes (JURECA), or memory fixed by the GPU count (Roihu's allocation type G)
            assert site in ("jureca", "roihu"), "only these sites may leave the memory out"


def test_roihu_asks_for_gh200s_by_the_node_in_the_partition_its_size_needs():
    o = opts("roihu", 2)
    assert (o["partition"], o["gres"], o["cpus-per-task"]) == ("gpumedium", "gpu:gh200:2", "144")
    assert "mem" not in o                                   # fixed per GPU: CSC's 217 GiB each
    assert opts("roihu", 8)["partition"] == "gpularge" and opts("roihu", 8)["nodes"] == "2"
    # gpularge is open only after CSC's scalability test: the header and the table say so
    assert "scalability test" in sp.header("roihu", 8).splitlines()[0]
    assert "scalability test" in next(r for r in sp.table(8) if r["site"] == "roihu")["requires"]
    assert "scalability" not in sp.header("roihu", 4)
    # CSC's 217 GiB a reserved GPU is 122 GiB LPDDR5 (host) + 95 GiB HBM3 (the GPU's own): the
    # table's memory per GPU is host memory at every site, the GPU's own in a column of its own
    roihu = sp.load("roihu")
    assert (roihu.mem_per_gpu_gb, roihu.gpu_mem_gb) == (122, 95)
    assert {k: sp.load(k).gpu_mem_gb for k in ("lumi", "jureca")} == {"lumi": 64, "jureca": 40}
    assert "python-pytorch" in sp.load("roihu").environment  # the module's name on Roihu-GPU
    pairs = dict(site_step.exports("roihu", "project_x"))
    assert (pairs["SBATCH_PARTITION"], pairs["SBATCH_GRES"]) == ("gpumedium", "gpu:gh200:4")
    assert "SBATCH_MEM_PER_GPU" not in pairs
    assert dict(site_step.exports("roihu", "project_x", test=True))["SBATCH_PARTITION"] == "gputest"


def test_retired_sites_are_marked_and_left_out_of_what_a_course_is_offered():
    assert sp.load("puhti").retired and sp.load("mahti").retired and not sp.load("roihu").retired
    assert sp.current_sites() == ["jureca", "lumi", "roihu"]
    out = subprocess.run([sys.executable, "-m", "source_code.launch.site_profiles", "--list"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert re.search(r"^puhti .*\(retired: compute services closed on 31 Jul 2026: use roihu\)$", out, re.M)


def test_puhti_full_node_memory_is_below_the_partition_maximum_not_the_installed_384g():
    assert opts("puhti", 4)["mem"] == "372G"  # 4 x 93 GiB <= 373 GiB; 380G would be refused
    assert "pytorch" in sp.load("puhti").environment  # V100 needs the module's CUDA 12 build


def test_lumi_cpu_masks_are_the_documented_ones_seven_cores_per_gcd():
    # the mask list of LUMI's "GPU Binding" section (distribution-binding page), local rank 0..7
    documented = ["fe000000000000", "fe00000000000000", "fe0000", "fe000000", "fe", "fe00",
                  "fe00000000", "fe0000000000"]
    text = (sp.SITES_DIR / "lumi.sh").read_text()
    masks = re.search(r'^SITE_CPU_MASKS="([^"]+)"', text, re.M).group(1).split(",")
    assert [int(m, 16) for m in masks] == [int(m, 16) for m in documented]
    cores = [[c for c in range(64) if int(m, 16) >> c & 1] for m in masks]
    assert all(len(c) == 7 for c in cores) and len(set(sum(cores, []))) == 56
    assert not set(sum(cores, [])) & set(range(0, 64, 8))  # first core of each CCD: the system's
    assert cores[0] == list(range(49, 56))  # GCD 0 sits next to NUMA node 3


def compose(site, env=None, tasks_per_node=1):
    """The launch lines slurm/launch.sh composes for `site` (modules stubbed: no cluster here)."""
    script = f"""module() {{ :; }}; ROOT={ROOT}; source slurm/sites/{site}.sh; site_environment
    source slurm/launch.sh; PYTHON=python3 TRAIN_MODULE=source_code.training.ddp NPROC_PER_NODE=8
    container_prefix || exit 2; export SITE_CPU_MASKS; srun_commands
    torchrun_command 2 --rdzv-backend=c10d --rdzv-endpoint=n1:20001 --rdzv-id=1
    print_command "${{SRUN_PER_NODE[@]}}" "${{TORCHRUN_CMD[@]}}"
    print_command "${{SRUN_PER_GPU[@]}}" "${{IN_CONTAINER[@]}}" "$PYTHON" -m "$TRAIN_MODULE" """
    full = {k: v for k, v in os.environ.items() if not k.startswith(("WORKSHOP_", "SITE_"))}
    full.update({"SLURM_NTASKS_PER_NODE": str(tasks_per_node), **(env or {})})
    res = subprocess.run(["bash", "-c", script], cwd=ROOT, env=full, capture_output=True, text=True)
    return res.returncode, [shlex.split(line) for line in res.stdout.splitlines()], res.stderr


def test_lumi_runs_in_the_given_container_with_cores_bound_to_each_gcd(tmp_path):
    image = tmp_path / "pytorch.sif"
    image.write_text("")
    rc, (per_node, per_gpu), _ = compose("lumi", {"WORKSHOP_CONTAINER": str(image), "CONTAINER_RUNTIME": "true"},
                                         tasks_per_node=8)
    i = per_node.index("true")  # the runtime, after srun ... per_node.sh
    assert per_node[:2] == ["srun", "--kill-on-bad-exit=1"] and per_node[i - 1].endswith("slurm/per_node.sh")
    assert per_node[i:i + 5] == ["true", "exec", "--bind", str(ROOT), str(image)] and per_node[i + 5] == "torchrun"
    assert per_node[-6:] == ["--no-python", "bash", f"{ROOT}/slurm/bind_local_rank.sh", "python3", "-m",
                             "source_code.training.ddp"]
    assert any(a.startswith("--cpu-bind=mask_cpu:0xfe000000000000,") for a in per_gpu)
    # a partial node (4 tasks): no masks, Slurm's own placement; LUMI_SIF picks the image
    _, (per_node4, per_gpu4), _ = compose("lumi", {"LUMI_SIF": str(image), "CONTAINER_RUNTIME": "true"},
                                          tasks_per_node=4)
    assert not any(a.startswith("--cpu-bind") for a in per_gpu4) and str(image) in per_node4
    rc, _, err = compose("lumi", {"WORKSHOP_CONTAINER": str(tmp_path / "missing.sif")})
    assert rc == 2 and "is not a file" in err


def test_lumi_runs_the_ai_factory_container_with_torch_new_enough_for_day_2_not_cscs_module():
    env = sp.load("lumi").environment
    assert "/appl/local/csc" not in env and "lumi-aif-singularity-bindings" in env
    text = (sp.SITES_DIR / "lumi.sh").read_text()
    image = re.search(r"^LUMI_SIF_DEFAULT=(\S+)$", text, re.M).group(1)
    # the release name's tNNN is its torch: 2.10 or newer, what day 2's notebooks need
    major, minor = re.search(r"/lumi-multitorch-full-u\d+r\d+f\d+m\d+t(\d)(\d+)-\d{8}_\d{6}\.sif$", image).groups()
    assert (int(major), int(minor)) >= (2, 10), image
    # without a container of the shell's own, every launch runs in that image
    rc, lines, err = compose("lumi", {"CONTAINER_RUNTIME": "true"})
    if not os.path.exists(image):                        # the image exists on LUMI only
        assert rc == 2 and f"WORKSHOP_CONTAINER={image} is not a file" in err, err
    else:
        assert image in lines[0]


def test_csc_wrapper_command_runs_the_launch_in_the_module_container():
    _, (per_node, per_gpu), _ = compose("puhti", {"WORKSHOP_CONTAINER_EXEC": "apptainer_wrapper exec"})
    i = per_node.index("apptainer_wrapper")
    assert per_node[i:i + 3] == ["apptainer_wrapper", "exec", "torchrun"]
    assert per_gpu[-5:] == ["apptainer_wrapper", "exec", "python3", "-m", "source_code.training.ddp"]


def test_jsc_torchrun_is_told_which_node_hosts_the_rendezvous():
    _, (per_node, _), _ = compose("jureca")
    assert "--cpu-bind=none" in per_node and "torchrun_jsc" in per_node
    assert "--rdzv-conf=is_host=@IS_HOST@" in per_node
    env = {k: v for k, v in os.environ.items() if k != "SITE_NODE_DIRS"}
    for node, expected in (("0", "1"), ("3", "0")):
        out = subprocess.run(["bash", str(ROOT / "slurm/per_node.sh"), "echo", "--rdzv-conf=is_host=@IS_HOST@"],
                             env={**env, "SLURM_NODEID": node}, capture_output=True, text=True).stdout
        assert out.strip() == f"--rdzv-conf=is_host={expected}"


def test_per_node_directories_exist_before_the_command_runs(tmp_path):
    d = tmp_path / "miopen-cache"
    res = subprocess.run(["bash", str(ROOT / "slurm/per_node.sh"), "test", "-d", str(d)],
                         env={**os.environ, "SITE_NODE_DIRS": str(d), "SLURM_NODEID": "1"})
    assert res.returncode == 0


def test_bind_local_rank_takes_the_mask_of_its_local_rank(tmp_path):
    fake = tmp_path / "taskset"  # prints the core list instead of binding
    fake.write_text('#!/bin/bash\necho "cores $2"\n')
    fake.chmod(0o755)
    masks = re.search(r'^SITE_CPU_MASKS="([^"]+)"', (sp.SITES_DIR / "lumi.sh").read_text(), re.M).group(1)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SITE_CPU_MASKS": masks,
           "LOCAL_WORLD_SIZE": "8"}
    run = lambda rank, **kw: subprocess.run(["bash", str(ROOT / "slurm/bind_local_rank.sh"), "true"],
                                            env={**env, "LOCAL_RANK": rank, **kw}, capture_output=True,
                                            text=True).stdout.strip()
    assert run("0") == "cores 49,50,51,52,53,54,55" and run("4") == "cores 1,2,3,4,5,6,7"
    assert "not a whole node, no CPU binding" in run("0", LOCAL_WORLD_SIZE="4")


def test_torch_older_than_2_6_is_one_line_naming_the_fix(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "2.5.1+cu121"\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "WORKSHOP_SITE": "local", "PYTHON": sys.executable}
    res = subprocess.run(["bash", "-c", f"ROOT={ROOT}; source $ROOT/slurm/common.sh"], cwd="/", env=env,
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "torch 2.5.1+cu121 is too old, the workshop needs torch >= 2.6" in res.stderr
    assert "PYTORCH_MODULE" in res.stderr and "WORKSHOP_VENV" in res.stderr


def test_master_port_stays_below_the_ephemeral_range():
    env = {**os.environ, "WORKSHOP_SITE": "local", "PYTHON": sys.executable, "SLURM_JOB_ID": "99999999",
           "SLURM_CPUS_PER_TASK": "2"}
    res = subprocess.run(["bash", "-c", f"ROOT={ROOT}; source $ROOT/slurm/common.sh >/dev/null; "
                          'echo "$MASTER_PORT $SRUN_CPUS_PER_TASK"'], cwd="/", env=env,
                         capture_output=True, text=True, check=True)
    port, srun_cpus = res.stdout.split()
    assert 20000 <= int(port) < 32768 and srun_cpus == "2"


def site_env(site) -> dict:
    """The variables a site's ``site_environment`` exports (modules stubbed: no cluster here)."""
    script = f"module() {{ :; }}; source slurm/sites/{site}.sh; site_environment; env -0"
    res = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if "SOCKET_IFNAME" not in k})
    return dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)


@pytest.mark.parametrize("site", sp.sites())
def test_gloo_sockets_use_the_interface_nccl_is_given(site):
    """Sites that point NCCL at their fast interfaces point gloo (the CPU half of
    cpu:gloo,cuda:nccl) at one of them too, not at whatever interface the hostname resolves to."""
    env = site_env(site)
    if "NCCL_SOCKET_IFNAME" not in env:
        assert "GLOO_SOCKET_IFNAME" not in env, site
        return
    assert env.get("GLOO_SOCKET_IFNAME") in env["NCCL_SOCKET_IFNAME"].split(","), site


def test_lumi_gloo_uses_the_first_slingshot_interface():
    env = site_env("lumi")
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"  # LUMI's documented RCCL setting
    assert env["GLOO_SOCKET_IFNAME"] == "hsn0"


@pytest.mark.parametrize("gpus", ["0", "-2"])
def test_zero_gpus_is_an_error_not_a_full_node(gpus, capsys):
    assert sp.main(["--site", "puhti", "--gpus", gpus]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"error: --gpus {gpus}: these headers are for GPU jobs" in captured.err


# ------------------------------------------------------------------ the site step (--format exports)
def step(*argv, env=None):
    """Run the site step as a participant does, eval'd in bash; the variables it leaves set."""
    cmd = (f'eval "$({shlex.quote(sys.executable)} -m source_code.launch.site_profiles '
           f'{" ".join(map(shlex.quote, argv))} --format exports)" && env -0')
    res = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True,
                         env={**{k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "WORKSHOP_SITE"))},
                              **(env or {})})
    got = dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)
    return res, {k: v for k, v in got.items() if k.startswith(("SBATCH_", "WORKSHOP_SITE"))}


@pytest.mark.parametrize("site,gpu", [("lumi", ("SBATCH_GPUS_PER_NODE", "8")),
                                      ("puhti", ("SBATCH_GRES", "gpu:v100:4")),
                                      ("mahti", ("SBATCH_GRES", "gpu:a100:4")),
                                      ("jureca", ("SBATCH_GRES", "gpu:4"))])
def test_site_step_exports_slurms_own_input_variables(site, gpu):
    res, got = step("--site", site, "--account", "project_x")
    assert res.returncode == 0, res.stderr
    assert got["WORKSHOP_SITE"] == site and got["SBATCH_ACCOUNT"] == "project_x"
    assert got[gpu[0]] == gpu[1] and got["SBATCH_PARTITION"] == sp.load(site).partition_full_nodes
    assert res.stderr.startswith(f"site {site} set up for sbatch in this shell:"), res.stderr
    # what the headers of the same site ask for, per node: the same GPUs, memory and partition
    full = dict(o.lstrip("-").split("=", 1) for o in sp.args(site, sp.load(site).gpus_per_node))
    if "mem" in full:
        assert int(got["SBATCH_MEM_PER_GPU"].rstrip("G")) * sp.load(site).gpus_per_node == int(full["mem"].rstrip("G"))
    assert full["partition"] == got["SBATCH_PARTITION"]


def test_site_step_replaces_an_earlier_sites_variables_and_names_the_fix_for_bad_input():
    _, lumi_then_puhti = step("--site", "puhti", env={"SBATCH_GPUS_PER_NODE": "8", "SBATCH_RESERVATION": "old"})
    assert "SBATCH_GPUS_PER_NODE" not in lumi_then_puhti and "SBATCH_RESERVATION" not in lumi_then_puhti
    res, got = step("--site", "mahti", "--gpus-per-node", "3")   # eval of nothing: the shell as it was
    assert not got and res.stderr.strip().splitlines() == [
        "error: Mahti's gpumedium takes whole nodes of 4 GPUs; use --gpus-per-node 2 or 4"]
    res, got = step("--site", "mahti", "--gpus-per-node", "2", "--time", "01:00:00")
    assert (got["SBATCH_PARTITION"], got["SBATCH_GRES"], got["SBATCH_TIMELIMIT"]) == ("gpusmall", "gpu:a100:2", "01:00:00")
    assert "no --account given" in res.stderr


@pytest.mark.parametrize("argv,message", [
    (["--site", "puhti", "--gpus", "8", "--test", "--time", "00:20:00"],
     "Puhti's test partition gputest takes at most 8 GPUs for 15 min"),
    (["--site", "puhti", "--gpus", "84"], "Puhti's partition gpu takes at most 20 node(s) for 3 days; this asks for 21 node(s)"),
    (["--site", "mahti", "--gpus", "32"], "Mahti's partition gpumedium takes at most 6 node(s) for 36 h"),
    (["--site", "lumi", "--gpus", "8", "--time", "3-00:00:00"],
     "LUMI's partition standard-g takes at most 1024 node(s) for 2 days; this asks for 1 node(s) for 3 days"),
    (["--site", "roihu", "--gpus", "44"], "Roihu's partition gpularge takes at most 10 node(s) for 36 h"),
    (["--site", "lumi", "--gpus", "40"], "LUMI's partition standard-g"),   # 5 nodes: fits
    (["--site", "lumi", "--gpus", "7", "--time", "4-00:00:00"], "LUMI's partition small-g takes at most 4 node(s) for 3 days"),
])
def test_partition_limits_are_checked_before_submission_in_one_line(argv, message):
    res = subprocess.run([sys.executable, "-m", "source_code.launch.site_profiles", *argv, "--format", "args"],
                         capture_output=True, text=True)
    if argv[-1] == "40":
        assert res.returncode == 0 and "--partition=standard-g" in res.stdout, res.stderr
        return
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "WORKSHOP_SITE"))}


@pytest.mark.parametrize("step_options,line,refused", [
    ("--site mahti --account p --gpus-per-node 2", ["sbatch", "slurm/ddp_multinode.slurm"],
     "Mahti's partition gpusmall takes at most 1 node(s) for 36 h; this job asks for 2 node(s)"),
    ("--site mahti --account p --gpus-per-node 2", ["sbatch", "slurm/ddp_single_node.slurm"], None),
    ("--site mahti --account p --gpus-per-node 2", ["sbatch", "--nodes=1", "slurm/ddp_multinode.slurm"], None),
    ("--site mahti --account p", ["sbatch", "slurm/ddp_multinode.slurm"], None),
    ("--site puhti --account p --test", ["sbatch", "-t", "1:00:00", "slurm/ddp_multinode.slurm"],
     "Puhti's partition gputest takes at most 2 node(s) for 15 min; this job asks for 2 node(s) for 1 h"),
    ("--site puhti --account p --test --time 00:10:00", ["sbatch", "-N", "3", "slurm/ddp_multinode.slurm"],
     "this job asks for 3 node(s) for 10 min"),
    # Roihu's gpumedium: 1-4 nodes, 4 GPUs a job in all (two nodes of 4 do not fit, of 2 do)
    ("--site roihu --account p", ["sbatch", "slurm/ddp_multinode.slurm"],
     "Roihu's partition gpumedium takes at most 4 GPU(s) a job, on 1 to 4 node(s); this job asks for "
     "2 node(s) x 4 GPU(s) = 8: not submitted; the site step with --gpus-per-node 2 (2 x 2)"),
    ("--site roihu --account p --gpus-per-node 2", ["sbatch", "slurm/ddp_multinode.slurm"], None),
    ("--site roihu --account p --gpus-per-node 1", ["sbatch", "-N", "4", "slurm/ddp_multinode.slurm"], None),
    ("--site roihu --account p --gpus-per-node 1", ["sbatch", "-N", "5", "slurm/ddp_multinode.slurm"],
     "Roihu's partition gpumedium takes at most 4 node(s) for 36 h; this job asks for 5 node(s)"),
    ("--site roihu --account p --gpus-per-node 2", ["sbatch", "-N", "3", "slurm/ddp_multinode.slurm"],
     "this job asks for 3 node(s) x 2 GPU(s) = 6: not submitted; the site step with --gpus-per-node 1 (3 x 1)"),
    ("--site roihu --account p --test", ["sbatch", "slurm/ddp_multinode.slurm"], None),
    ("--site lumi --account p --gpus-per-node 2", ["sbatch", "-N8", "slurm/ddp_multinode.slurm"],
     "LUMI's partition small-g takes at most 4 node(s)"),
    ("--site lumi --account p --gpus-per-node 2", ["sbatch", "-p", "standard-g", "-N8", "slurm/ddp_multinode.slurm"], None),
    ("--site lumi --account p", ["sbatch", "--wrap", "hostname"], None),
    ("--site lumi --account p", ["sbatch", "-t", "3-00:00:00", "slurm/ddp_single_node.slurm"],
     "standard-g takes at most 1024 node(s) for 2 days; this job asks for 1 node(s) for 3 days: not submitted; ask for 2 days"),
])
def test_a_bare_line_its_partition_cannot_take_is_refused_before_submission(step_options, line, refused):
    code, said, reached = site_step.try_line(step_options, line, CLEAN_ENV, cwd=ROOT)
    if refused is None:
        assert code == 0 and reached, said
    else:
        assert code == 2 and not reached and len(said.splitlines()) == 1, said
        assert said.startswith("error: ") and refused in said and ": not submitted; " in said, said


@pytest.mark.parametrize("step_options,line,added", [
    # one task a node (torchrun's scripts): the profile's cores per GPU x the job's GPUs a node
    ("--site lumi --account p --gpus-per-node 2", ["sbatch", "slurm/ddp_multinode.slurm"], "--cpus-per-task=14"),
    ("--site lumi --account p", ["sbatch", "slurm/ddp_single_node.slurm", "--epochs", "8"], "--cpus-per-task=56"),
    ("--site jureca --account p", ["sbatch", "slurm/ddp_multinode.slurm"], "--cpus-per-task=128"),
    ("--site roihu --account p --test", ["sbatch", "slurm/ddp_multinode.slurm"], "--cpus-per-task=288"),
    ("--site local-gpu --gpus-per-node 1", ["sbatch", "slurm/ddp_single_node.slurm"], "--cpus-per-task=1"),
    ("--site lumi --account p", ["sbatch", "--gpus-per-node=2", "slurm/ddp_single_node.slurm"], "--cpus-per-task=14"),
    # the line's own cores, a task per GPU, no job script: nothing added
    ("--site lumi --account p", ["sbatch", "-c", "8", "slurm/ddp_single_node.slurm"], None),
    # a task per GPU (the srun script): a task a GPU, each the profile's share
    ("--site lumi --account p --gpus-per-node 2", ["sbatch", "slurm/ddp_single_node_srun.slurm"],
     "--ntasks-per-node=2 --cpus-per-task=7"),
    ("--site jureca --account p", ["sbatch", "slurm/ddp_single_node_srun.slurm"], "--ntasks-per-node=4 --cpus-per-task=32"),
    ("--site lumi --account p", ["sbatch", "--ntasks-per-node=8", "slurm/ddp_single_node_srun.slurm"], None),
    ("--site jureca --account p", ["sbatch", "--wrap", "hostname"], None),   # LUMI's: tests/test_site_wrap.py
])
def test_the_sbatch_function_gives_a_task_per_node_script_its_gpus_cores(step_options, line, added):
    code, said, reached = site_step.try_line(step_options, line, CLEAN_ENV, cwd=ROOT)
    assert code == 0 and reached, said
    submitted = next(ln for ln in said.splitlines() if ln.startswith("sbatch reached"))
    script = next(w for w in line if w.startswith("slurm/") or w == "--wrap")
    if added is None:
        assert "--cpus-per-task=" not in submitted and "note: the site step adds" not in said, said
        assert f"({' '.join(line[1:])})" in submitted, said       # the line as typed
    else:   # before the line's own words, said in one note line
        assert f"({added} {' '.join(line[1:])})" in submitted and script in submitted, said
        assert f"note: the site step adds {added} to the script's " in said, said


def test_every_partition_a_profile_names_has_its_limits():
    for key in sp.sites():
        site = sp.load(key)
        named = {site.partition, site.partition_full_nodes, site.partition_test}
        assert named <= {p for p, _, _ in site.limits}, (key, named, site.limits)
        for site_key, lim in LIMITS.items():   # and they are the documented ones
            if site_key == key:
                for part, max_nodes, max_time in site.limits:
                    doc = lim["partitions"][part]
                    if doc[1] is not None:
                        assert (max_nodes, sp.minutes(max_time)) == (doc[1], doc[2]), (key, part)
                        # a limit of GPUs a job in all (Roihu's gpumedium), where the guide gives one
                        assert dict(site.gpu_limits).get(part) == (doc[0] if doc[4:] else None), (key, part)


def job_script_env(**env):
    """Source common.sh as a job script does, inside a fake Slurm job (no cluster needed)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "WORKSHOP_"))}
    full.update({"PYTHON": sys.executable, "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n1", **env})
    return subprocess.run(["bash", "-c", f"ROOT={ROOT}; source $ROOT/slurm/common.sh"], cwd="/", env=full,
                          capture_output=True, text=True)


def test_a_job_on_a_site_without_the_site_step_stops_in_one_line():
    res = job_script_env(SLURM_CLUSTER_NAME="lumi")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: no site set up for job 42 on cluster lumi: run eval") \
        and "--format exports" in res.stderr and "puhti" in res.stderr and "local" not in res.stderr.split("sites:")[1].split(")")[0]
    res = job_script_env(SLURM_CLUSTER_NAME="lumi", WORKSHOP_DEVICE="cpu")
    assert res.returncode == 0 and "note: WORKSHOP_DEVICE=cpu and no site set up" in res.stdout, res.stderr


def test_a_gpu_profile_without_gpus_and_more_processes_than_gpus_stop_in_one_line():
    res = job_script_env(SLURM_CLUSTER_NAME="lumi", WORKSHOP_SITE="puhti")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "error: site puhti runs on GPUs but job 42 was given none" in res.stderr
    assert "--gres=gpu:v100:N" in res.stderr and "WORKSHOP_DEVICE=cpu runs on the CPU instead" in res.stderr
    res = job_script_env(WORKSHOP_SITE="local-gpu", SLURM_GPUS_ON_NODE="2", NPROC_PER_NODE="4")
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: 4 process(es) per node but job 42 has 2 GPU(s) per node: one process per GPU (leave "
        "NPROC_PER_NODE and --ntasks-per-node to the job script), or ask for more GPUs"), res.stderr
    res = job_script_env(WORKSHOP_SITE="local-gpu", SLURM_GPUS_PER_NODE="gpu:2")
    assert res.returncode == 0 and "2 process(es) per task, 2 GPU(s) per node" in res.stdout, res.stderr
    assert "no GPU device exists, so the processes run on the CPU" in res.stdout


def test_jureca_shows_each_process_the_gpus_the_job_asked_for():
    assert site_env_with("jureca", SLURM_GPUS_ON_NODE="2")["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert site_env_with("jureca")["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def site_env_with(site, **env):
    script = f"module() {{ :; }}; source slurm/sites/{site}.sh; site_environment; env -0"
    res = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**{k: v for k, v in os.environ.items() if "SOCKET_IFNAME" not in k}, **env})
    return dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)


def test_fewer_processes_or_cores_than_the_gpus_need_are_one_note_each():
    res = job_script_env(WORKSHOP_SITE="local-gpu", SLURM_GPUS_ON_NODE="2", NPROC_PER_NODE="1", SLURM_CPUS_ON_NODE="2")
    assert res.returncode == 0 and "note: 1 process(es) per node for 2 GPU(s) per node: 1 GPU(s) idle" in res.stdout
    assert "CPU core(s) for" not in res.stdout, res.stdout
    res = job_script_env(WORKSHOP_SITE="local-gpu", SLURM_GPUS_ON_NODE="2", SLURM_CPUS_ON_NODE="1")
    notes = [ln for ln in res.stdout.splitlines() if "CPU core(s) for" in ln]
    assert res.returncode == 0 and len(notes) == 1 and "idle" not in res.stdout, res.stdout
    assert "has 1 CPU core(s) for 2 GPU(s) on this node, local-gpu's share is 1 per GPU: " \
           "sbatch --cpus-per-task=2 " in notes[0] and "--format args" in notes[0]


def test_the_torchrun_task_of_a_node_gets_the_nodes_whole_allocation():
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "WORKSHOP_"))}
    full.update(PYTHON=sys.executable, SLURM_JOB_ID="42", SLURM_JOB_NODELIST="n1", WORKSHOP_SITE="local-gpu",
                SLURM_GPUS_ON_NODE="2", SLURM_CPUS_PER_TASK="2", SLURM_CPUS_ON_NODE="14")
    res = subprocess.run(["bash", "-c", f'ROOT={ROOT}; source $ROOT/slurm/common.sh >/dev/null; '
                          'print_command "${SRUN_PER_NODE[@]}"; echo "SRUN_CPUS_PER_TASK=$SRUN_CPUS_PER_TASK"'],
                         cwd="/", env=full, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "--ntasks-per-node=1 --cpus-per-task=14 " in res.stdout, res.stdout
    assert "SRUN_CPUS_PER_TASK=2" in res.stdout      # a task per GPU: the job's cores per task


@pytest.mark.parametrize("argv,message", [
    (["--site", "lumi", "--partition", "small-g"], "small-g takes at most 7 GPUs per node; this asks for 8"),
    (["--site", "lumi", "--partition", "standard-g", "--gpus-per-node", "4"], "standard-g takes whole nodes of 8"),
    (["--site", "mahti", "--partition", "gpusmall"], "gpusmall takes at most 2 GPUs per node"),
])
def test_a_partition_given_or_reserved_must_take_the_gpus_asked_for(argv, message):
    res, got = step(*argv)
    assert not got and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    _, fits = step("--site", "lumi", "--partition", "small-g", "--gpus-per-node", "7")
    assert fits["SBATCH_PARTITION"] == "small-g"


def memory_left(tmp_path, scontrol_says: str, **env) -> tuple[dict, str]:
    """The SLURM_MEM_PER_* a job script leaves for its sruns, and what it said, inside a fake job
    whose `scontrol show job` prints ``scontrol_says`` (no cluster needed)."""
    (tmp_path / "scontrol").write_text(f"#!/bin/sh\necho '{scontrol_says}'\n")
    (tmp_path / "scontrol").chmod(0o755)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    full.update({"PATH": f"{tmp_path}:{full['PATH']}", "SLURM_JOB_ID": "42", **env})
    res = subprocess.run(["bash", "-c", f"source {ROOT}/slurm/launch.sh; drop_inherited_memory; env -0"],
                         env=full, capture_output=True, text=True, check=True)
    left = dict(kv.split("=", 1) for kv in res.stdout.split("\0") if kv.startswith("SLURM_MEM_PER_"))
    return left, "\n".join(ln for ln in res.stdout.split("\0")[0].splitlines() if ln.startswith("note:"))


def test_memory_inherited_from_the_lab_job_is_dropped_where_it_conflicts_with_the_jobs_own(tmp_path):
    # a lab job's --mem-per-cpu and --mem came along; this job asked per GPU (the site step)
    inherited = {"SLURM_MEM_PER_CPU": "1000", "SLURM_MEM_PER_NODE": "2000", "SLURM_MEM_PER_GPU": "3072"}
    left, said = memory_left(tmp_path, "MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0\n MemPerTres=gres:gpu:3072",
                             **inherited)
    assert left == {"SLURM_MEM_PER_GPU": "3072"}
    assert said.count("note:") == 2 and "SLURM_MEM_PER_CPU=1000 came from" in said and "per gpu" in said
    # this job asked per node (--mem): the per-CPU one goes, whatever the site step set
    left, _ = memory_left(tmp_path, "MinCPUsNode=2 MinMemoryNode=7G", SLURM_MEM_PER_CPU="1000",
                          SLURM_MEM_PER_NODE="7168", SBATCH_MEM_PER_GPU="3G")
    assert left == {"SLURM_MEM_PER_NODE": "7168"}
    # scontrol silent: the site step's SBATCH_MEM_PER_GPU names this job's kind
    left, _ = memory_left(tmp_path, "", SLURM_MEM_PER_CPU="1000", SLURM_MEM_PER_GPU="3072", SBATCH_MEM_PER_GPU="3G")
    assert left == {"SLURM_MEM_PER_GPU": "3072"}
    # one kind only, or nothing known: untouched (no conflict, or srun says what it finds)
    assert memory_left(tmp_path, "MinMemoryCPU=1000M", SLURM_MEM_PER_CPU="1000")[0] == {"SLURM_MEM_PER_CPU": "1000"}
    both = {"SLURM_MEM_PER_CPU": "1000", "SLURM_MEM_PER_NODE": "2000"}
    assert memory_left(tmp_path, "", **both) == (both, "")


def test_a_refusal_on_guessed_limits_says_they_are_a_guess():
    # JURECA's partition limits are the profile's guess (JSC's table not read): a refusal says so
    with pytest.raises(sp.ProfileError, match="the profile's guess: scontrol show partition dc-gpu-devel"):
        sp.args("jureca", 4 * 8, test=True, time="01:00:00")
    with pytest.raises(sp.ProfileError, match="takes at most 128 node.*the profile's guess: scontrol show partition dc-gpu on"):
        sp.args("jureca", 4 * 200)
    with pytest.raises(sp.ProfileError) as err:
        sp.args("lumi", 8 * 5, time="3-00:00:00")
    assert "guess" not in err.value.message
    env = {"WORKSHOP_SITE": "jureca", "SBATCH_PARTITION": "dc-gpu-devel", "SBATCH_GRES": "gpu:4"}
    said = site_step.check_submission(["--nodes=5", "slurm/ddp_multinode.slurm"], env, ROOT)
    assert said and "takes at most 4 node(s)" in said and "the profile's guess" in said
