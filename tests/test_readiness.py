"""`make check`: the readiness table an instructor runs on the course machines the day before."""
import pytest

from source_code import readiness


def test_every_requirement_is_met_or_not_needed_on_this_machine(capsys, monkeypatch):
    # where sbatch is installed (the suite's local cluster), the site profile must be named
    monkeypatch.setenv("WORKSHOP_SITE", "local")
    assert readiness.main([]) == 0
    out = capsys.readouterr().out
    for name in readiness.CHECKS:
        assert f"\n{name:<22} " in out, name
    assert "gloo, 2 processes      ok" in out and "Jupyter kernel         ok" in out
    assert f"readiness: {len(readiness.CHECKS)} of {len(readiness.CHECKS)} requirements" in out


def test_a_missing_dataset_names_the_prepare_command(tmp_path, capsys):
    assert readiness.main(["--data-dir", str(tmp_path), "--datasets", "mnist",
                           "--only", "prepared datasets"]) == 1
    out = capsys.readouterr().out
    assert "FIX" in out and f"python -m source_code.data prepare --data-dir {tmp_path} --dataset mnist" in out


def test_an_old_torch_is_a_fix_not_a_crash(monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu121")
    assert readiness.main(["--only", "torch"]) == 1
    assert "torch 2.5.1+cu121 is older than 2.6" in capsys.readouterr().out


def test_packages_a_site_module_lacks_are_named_with_the_pip_line(monkeypatch, capsys):
    from importlib import util
    real = util.find_spec
    gone = {"sklearn": None, "torchft": None}
    monkeypatch.setattr(util, "find_spec", lambda name, *a: gone[name] if name in gone else real(name, *a))
    assert readiness.main(["--only", "packages"]) == 1          # every notebook needs scikit-learn
    out = capsys.readouterr().out
    assert "FIX" in out and "python3 -m pip install --user scikit-learn torchft" in out
    del gone["sklearn"]
    assert readiness.main(["--only", "packages"]) == 0          # notebook 17's package: a warning
    out = capsys.readouterr().out
    assert "WARN" in out and "torchft (17)" in out and "1 WARN row" in out


def test_unknown_check_is_refused():
    with pytest.raises(SystemExit):
        readiness.main(["--only", "coffee"])


def test_a_login_node_without_a_site_profile_is_told_to_name_one(monkeypatch, capsys):
    monkeypatch.setattr(readiness.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.delenv("WORKSHOP_SITE", raising=False)
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")  # a real site's configuration
    assert readiness.main(["--only", "Slurm and site"]) == 1
    out = capsys.readouterr().out
    assert "export WORKSHOP_SITE=<one of jureca, lumi, roihu>" in out, out


def test_the_local_test_cluster_needs_no_site_profile(monkeypatch, capsys, tmp_path):
    """A learner whose machine runs the local cluster (make cluster-up, make test) is not told
    to fix a non-problem: its jobs use the local profile, which is the default."""
    from source_code.launch import jobs
    conf = tmp_path / "slurm.conf"
    conf.write_text(jobs.LOCAL_CLUSTER_MARK + "; state in /tmp/x\nClusterName=workshop\n")
    monkeypatch.setattr(readiness.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.delenv("WORKSHOP_SITE", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert readiness.main(["--only", "Slurm and site"]) == 0
    assert "local test cluster" in capsys.readouterr().out


@pytest.fixture
def slurm_here(monkeypatch, tmp_path):
    """sbatch on the PATH of a real site (not the local test cluster), no job of ours yet."""
    monkeypatch.setattr(readiness.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setattr(readiness.socket, "gethostname", lambda: "puhti-login11")
    for name in ("SINGULARITY_CONTAINER", "APPTAINER_CONTAINER"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("salloc", [False, True])
def test_a_login_node_is_told_never_to_run_the_notebooks_there(salloc, slurm_here, monkeypatch, capsys):
    # a warning, not a failure: make check is meant to run on the login node too; salloc's shell
    # has a job id but runs on the login node (no SLURMD_NODENAME: no job step there)
    if salloc:
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert readiness.main(["--only", "where notebooks run"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("where notebooks run"))
    assert row.split()[3] == "WARN", out
    assert ("puhti-login11 is salloc's shell for job 4242" if salloc else "puhti-login11 looks like a login node") in row
    assert "never run the multi-process notebooks here" in row and "LAB_ON_A_CLUSTER.md" in row
    assert out.rstrip().endswith("; 1 WARN row(s) to read"), out


@pytest.mark.parametrize("where", ["a job on the same cluster", "a laptop", "the local test cluster"])
def test_a_compute_node_a_laptop_and_the_local_cluster_are_no_login_node(where, slurm_here, monkeypatch,
                                                                         capsys, tmp_path):
    from source_code.launch import jobs
    if where == "a job on the same cluster":   # an OnDemand lab, an srun shell: sbatch is there too
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
        monkeypatch.setenv("SLURMD_NODENAME", "r07g03")
    elif where == "a laptop":
        monkeypatch.setattr(readiness.shutil, "which", lambda name: None)
    else:
        conf = tmp_path / "slurm.conf"
        conf.write_text(jobs.LOCAL_CLUSTER_MARK + "\nClusterName=workshop\n")
        monkeypatch.setenv("SLURM_CONF", str(conf))
    assert readiness.main(["--only", "where notebooks run"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("where notebooks run"))
    assert row.split()[3] == "ok" and "WARN" not in out, out
    assert where != "a job on the same cluster" or "compute node r07g03, Slurm job 4242" in row


@pytest.mark.parametrize("runtime", ["SINGULARITY_CONTAINER", "APPTAINER_CONTAINER"])
def test_inside_a_sites_image_on_the_login_node_is_a_login_node_too(runtime, slurm_here, monkeypatch, capsys):
    # LUMI's check runs inside the AI Factory image, which has no sbatch: without a job, the
    # image runs on the login node, and the row must say so (not "the notebooks run here")
    monkeypatch.setattr(readiness.shutil, "which", lambda name: None)
    monkeypatch.setenv(runtime, "/appl/local/laifs/containers/x/lumi-multitorch-full-x.sif")
    assert readiness.main(["--only", "where notebooks run,Slurm and site"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("where notebooks run"))
    assert row.split()[3] == "WARN" and "inside the container image /appl/local/laifs/" in row, out
    assert "never run the multi-process notebooks here" in row and "the notebooks run here" not in row
    slurm = next(ln for ln in out.splitlines() if ln.startswith("Slurm and site"))
    assert "skipped" in slurm and "the sbatch lines run outside it" in slurm, out
    # the same image inside a job on a compute node: ok
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURMD_NODENAME", "nid005000")
    assert readiness.main(["--only", "where notebooks run"]) == 0
    assert "compute node nid005000, Slurm job 4242" in capsys.readouterr().out
