"""Which Python a job runs on a site whose module lines put their own in front, and which Python
the site step's sbatch function runs its check with (no cluster here: stand-ins for Lmod's
`module`, a Stage Python without torch, a participant's venv and sbatch)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from source_code.launch import site_step

ROOT = Path(__file__).resolve().parents[1]


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def jureca_job(tmp: Path, **env) -> subprocess.CompletedProcess:
    """slurm/common.sh in a fake JURECA job: `module load` puts a Stage bin in front of PATH whose
    python3 has no torch (it runs without site-packages), as JURECA's Stage Python has none; the
    participant's venv (python3 with torch, torchrun_jsc) is on PATH behind it, as at submission."""
    stage, venv = tmp / "stage", tmp / "venv"
    executable(stage / "bin/python3", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S "$@"\n')
    executable(venv / "bin/python3", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    executable(venv / "bin/torchrun_jsc", "#!/bin/sh\n")
    (venv / "bin/activate").write_text(f'VIRTUAL_ENV={venv}\nexport VIRTUAL_ENV\nPATH="$VIRTUAL_ENV/bin:$PATH"\n'
                                       "export PATH\n")
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "WORKSHOP_", "VIRTUAL_ENV", "PYTHON"))}
    full.update({"PATH": f"{venv}/bin:{os.environ['PATH']}", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n1",
                 "SLURM_CLUSTER_NAME": "jureca", "WORKSHOP_SITE": "jureca", "SLURM_GPUS_ON_NODE": "4",
                 "SLURM_CPUS_ON_NODE": "128", **env})
    module = f'module() {{ [ "$1" = load ] && PATH={stage}/bin:$PATH; return 0; }}'
    return subprocess.run(["bash", "-c", f"{module}; ROOT={ROOT}; source $ROOT/slurm/common.sh"], cwd="/",
                          env=full, capture_output=True, text=True)


def test_the_venv_active_at_submission_runs_the_job_after_the_sites_module_lines(tmp_path):
    # without it (what `module load ... Python` leaves): the Stage's python3, which has no torch
    bare = jureca_job(tmp_path)
    assert bare.returncode == 2 and "stage/bin/python3" not in bare.stdout, bare.stdout
    assert bare.stderr.count("\n") == 1 and "cannot import torch" in bare.stderr, bare.stderr
    # the participant's activated venv (sbatch passes VIRTUAL_ENV on): in front again, the job runs
    done = jureca_job(tmp_path, VIRTUAL_ENV=str(tmp_path / "venv"))
    assert done.returncode == 0, done.stderr
    first = next(ln for ln in done.stdout.splitlines() if ln.startswith("job 42 "))
    assert f"python {tmp_path / 'venv/bin/python3'}," in first, first
    # WORKSHOP_VENV, where set, wins: a venv that is none is one line naming it
    other = jureca_job(tmp_path, VIRTUAL_ENV=str(tmp_path / "venv"), WORKSHOP_VENV=str(tmp_path / "none"))
    assert other.returncode == 2 and f"WORKSHOP_VENV={tmp_path / 'none'} is not a venv" in other.stderr


def test_the_sbatch_function_finds_a_python_when_the_steps_own_is_gone(tmp_path):
    """The step's Python may be gone when the function runs (a module unloaded, a container's path
    that exists only inside its image): the python3 on PATH then runs the check; where none
    starts, the job goes to sbatch unchecked with one note line."""
    executable(tmp_path / "bin/sbatch", "#!/bin/sh\necho reached\n")
    guard = site_step.guard_function().replace(shlex.quote(sys.executable), "/no/such/python")
    line = f"{guard}\nexport WORKSHOP_SITE=mahti SBATCH_PARTITION=gpusmall\nsbatch slurm/ddp_multinode.slurm"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "WORKSHOP_"))}
    executable(tmp_path / "py/python3", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    found = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True,
                           env={**clean, "PATH": f"{tmp_path}/bin:{tmp_path}/py:/usr/bin:/bin"})
    assert found.returncode == 2 and "reached" not in found.stdout, found.stdout + found.stderr
    assert found.stderr.strip().startswith("error: Mahti's partition gpusmall takes at most 1 node(s)"), found.stderr
    assert found.stderr.count("\n") == 1, found.stderr      # nothing said of the missing one
    none = subprocess.run(["/bin/bash", "-c", line], cwd=ROOT, capture_output=True, text=True,
                          env={**clean, "PATH": f"{tmp_path}/bin"})
    assert none.returncode == 0 and none.stdout.strip() == "reached", none.stdout + none.stderr
    assert none.stderr.strip() == ("note: the site step's partition check could not start (/no/such/python, "
                                   "then python3: exit 127): the job goes to sbatch unchecked; load a Python "
                                   "3.10 or newer and run the site step again in this shell"), none.stderr
