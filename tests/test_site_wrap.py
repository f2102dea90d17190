"""A `sbatch --wrap "python -m ..."` line after the site step: on a site whose jobs run inside a
container image (LUMI), the site step's sbatch function submits the command wrapped the way the
job scripts run theirs (the profile's site_environment, then slurm/launch.sh's container prefix),
so the job's Python is the image's, not the login node's cray-python without torch. Run here
with stand-ins for sbatch (it keeps the arguments), singularity and Lmod's module (they log what
they were asked and singularity runs the command): no cluster, no image."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from source_code.launch import sbatch_line

ROOT = Path(__file__).resolve().parents[1]
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if not k.startswith(("SBATCH_", "WORKSHOP_", "LUMI_SIF", "SINGULARITY", "APPTAINER"))}
COMMAND = "python3 -c 'import os, sys; print(\"ran in\", os.environ[\"WORKSHOP_CONTAINER\"], sys.argv[1:])' a b"


def stand_ins(tmp: Path) -> dict:
    """sbatch (its arguments, NUL-separated, to a file), singularity and module (their words to a log)."""
    bin_ = tmp / "bin"
    bin_.mkdir()
    (bin_ / "sbatch").write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {tmp}/sbatch-args\necho "Submitted batch job 7"\n')
    (bin_ / "singularity").write_text(
        f'#!/bin/bash\necho "singularity $*" >> {tmp}/log\n[ "$1" = exec ] && shift\n'
        'while [ "$1" = --bind ]; do shift 2; done\nshift\nexec "$@"\n')
    (bin_ / "python3").symlink_to(sys.executable)
    for f in ("sbatch", "singularity"):
        (bin_ / f).chmod(0o755)
    (tmp / "image.sif").write_text("not an image: the stand-in singularity runs the command itself\n")
    return {**CLEAN_ENV, "PATH": f"{bin_}:{CLEAN_ENV['PATH']}", "LUMI_SIF": str(tmp / "image.sif")}


def submit(tmp: Path, site: str, line: str, env: dict) -> tuple[subprocess.CompletedProcess, list[str]]:
    step = (f'eval "$({shlex.quote(sys.executable)} -m source_code.launch.site_profiles --site {site} '
            '--account project_x --format exports)"')
    done = subprocess.run(["bash", "-c", f"{step} && {line}"], cwd=ROOT, capture_output=True, text=True, env=env)
    args = (tmp / "sbatch-args").read_text().split("\0")[:-1] if (tmp / "sbatch-args").exists() else []
    return done, args


@pytest.mark.parametrize("form", ["--wrap {q}", "--wrap={q}", "-t 00:10:00 --wrap {q} -J wrapped"])
def test_lumi_wrap_line_runs_its_command_inside_the_image(tmp_path, form):
    env = stand_ins(tmp_path)
    done, args = submit(tmp_path, "lumi", "sbatch " + form.format(q=shlex.quote(COMMAND)), env)
    assert done.returncode == 0 and "Submitted batch job 7" in done.stdout, done.stderr
    assert "note: the site step runs the --wrap command inside LUMI's container image" in done.stderr
    wrap = args[args.index("--wrap") + 1]
    assert COMMAND not in args and args.count("--wrap") == 1 and not any(a.startswith("--wrap=") for a in args)
    assert [a for a in args if a in ("-t", "00:10:00", "-J", "wrapped")] == \
        [w for w in shlex.split(form.format(q="x")) if w in ("-t", "00:10:00", "-J", "wrapped")]
    # the job: sbatch's script is `#!/bin/sh` + the command (LUMI's sh is bash), run in the
    # submitting shell's environment, where Lmod's `module` is an exported function
    job_env = {**env, "BASH_FUNC_module%%": f'() {{ echo "module $*" >> {tmp_path}/log; }}'}
    job = subprocess.run(["bash", "--posix", "-c", wrap], cwd=ROOT, capture_output=True, text=True, env=job_env)
    assert job.returncode == 0, job.stderr
    assert job.stdout.strip() == f"ran in {tmp_path}/image.sif ['a', 'b']", job.stdout + job.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert "module load lumi-aif-singularity-bindings" in log, log
    assert f"singularity exec --bind {ROOT} {tmp_path}/image.sif bash -c {COMMAND}" in log, log


def test_the_image_missing_stops_the_wrapped_job_in_one_line(tmp_path):
    env = {**stand_ins(tmp_path), "LUMI_SIF": str(tmp_path / "no-such.sif")}
    done, args = submit(tmp_path, "lumi", f"sbatch --wrap {shlex.quote(COMMAND)}", env)
    job_env = {**env, "BASH_FUNC_module%%": "() { :; }"}
    job = subprocess.run(["bash", "--posix", "-c", args[args.index("--wrap") + 1]], cwd=ROOT,
                         capture_output=True, text=True, env=job_env)
    assert job.returncode == 2 and job.stdout == "", job.stdout
    assert job.stderr.strip() == (f"error: WORKSHOP_CONTAINER={tmp_path}/no-such.sif is not a file; give the "
                                  "path of the site's PyTorch image (.sif)"), job.stderr


@pytest.mark.parametrize("site", ["roihu", "jureca"])
def test_a_site_without_an_image_submits_the_wrap_line_as_typed(tmp_path, site):
    done, args = submit(tmp_path, site, f"sbatch --wrap {shlex.quote(COMMAND)}", stand_ins(tmp_path))
    assert done.returncode == 0 and args == ["--wrap", COMMAND], (args, done.stderr)
    assert "inside" not in done.stderr


def test_command_sbatch_and_a_named_image_elsewhere():
    # `command sbatch` skips the function (said in the note); a shell that names an image of its
    # own gets it on any site
    assert sbatch_line.in_site_container(["--wrap", "x"], {"WORKSHOP_SITE": "roihu"}, ROOT) == ([], "")
    wrapped, note = sbatch_line.in_site_container(
        ["--wrap", "x"], {"WORKSHOP_SITE": "roihu", "WORKSHOP_CONTAINER": "/img.sif"}, ROOT)
    assert wrapped[0] == "--wrap" and "container_prefix" in wrapped[1] and "command sbatch" in note
    assert sbatch_line.in_site_container(["slurm/ddp_single_node.slurm"], {"WORKSHOP_SITE": "lumi"}, ROOT) == ([], "")
