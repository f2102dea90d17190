"""The resource calculator and the site profiles: the rules of thumb, computed and checked."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from source_code.launch import site_profiles as sp

ROOT = sp.SITES_DIR.parents[1]


def opts(site, gpus, launcher="torchrun"):
    return dict(o.lstrip("-").split("=", 1) for o in sp.args(site, gpus, launcher))


def test_every_required_site_has_a_profile():
    assert {"puhti", "mahti", "lumi", "jureca", "local"} <= set(sp.sites())
    for key in sp.sites():
        site = sp.load(key)
        assert site.partition and site.gpus_per_node > 0 and site.environment


@pytest.mark.parametrize("site,gres", [("puhti", "gres=gpu:v100:4"), ("mahti", "gres=gpu:a100:4"),
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
    for key in ("puhti", "mahti", "jureca"):
        site = sp.load(key)
        o = opts(key, 2, "srun")
        assert int(o["cpus-per-task"]) * site.gpus_per_node <= site.cpus_per_node
        assert int(o["mem"].rstrip("G")) <= site.mem_per_node_gb // 2
    assert opts("puhti", 1)["cpus-per-task"] == "10"  # 40 cores / 4 GPUs


def test_partial_node_and_full_node_partitions():
    assert opts("mahti", 2)["partition"] == "gpusmall"
    assert opts("mahti", 8)["partition"] == "gpumedium"


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
        assert not re.search(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", text), p


def test_profiles_are_valid_shell_with_a_site_environment_function():
    for key in sp.sites():
        res = subprocess.run(["bash", "-n", str(sp.SITES_DIR / f"{key}.sh")], capture_output=True)
        assert res.returncode == 0, key
        res = subprocess.run(["bash", "-c", f"source {sp.SITES_DIR / key}.sh && type site_environment "
                              "&& echo $SITE_GPUS_PER_NODE"], capture_output=True, text=True)
        assert res.stdout.split()[-1] == str(sp.load(key).gpus_per_node), key
