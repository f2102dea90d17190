"""The site step's sbatch function, used as typed on the local cluster (local-gpu): a bare torchrun
job line gets the profile's cores per GPU for the GPUs it asks for, and the job's first line says
how many cores its task got."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402,F401  (the cluster fixture's module)

from source_code.launch import jobs

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]


def test_a_bare_line_after_the_step_gets_its_gpus_cores(cluster, tmp_path):
    step = (f'eval "$({shlex.quote(sys.executable)} -m source_code.launch.site_profiles --site local-gpu '
            '--gpus-per-node 1 --format exports)"')
    line = f"sbatch --parsable -o {tmp_path}/%x-%j.out slurm/ddp_single_node.slurm"   # as typed, bare
    env = jobs.submit_shell(TRAIN_MODULE="source_code.launch.whoami")
    done = subprocess.run(["bash", "-c", f"{step} && {line}"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "note: the site step adds --cpus-per-task=1 to the script's one task a node" in done.stderr
    job_id = done.stdout.strip().split(";")[0]
    info = jobs.wait(job_id, timeout=150)
    output = Path(info["StdOut"]).read_text()
    first = next(ln for ln in output.splitlines() if ln.startswith(f"job {job_id} "))
    # the script's #SBATCH --cpus-per-task=2 gave way to the step's 1 core for 1 GPU
    assert re.search(r"1 GPU\(s\) per node, 1 CPU core\(s\) per task", first), output
    assert info["JobState"] == "COMPLETED", (info, output)
