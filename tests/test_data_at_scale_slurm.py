"""Notebook 20's Slurm jobs: one node refused in one line, before any work; and the requeue drill:
killed mid-epoch on 2 nodes, requeued on 1, every sample trained exactly once across the kill.

The first job (shards staged to each node's own directory, trained on 2 nodes and stopped
mid-epoch, resumed on 1 node, every sample once, or it fails) runs as the notebook prints it,
in tests/test_sbatch_lines.py; this file submits what that line cannot show."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402
from source_code.launch.jobs import WAITING  # noqa: E402

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]


def test_a_job_with_one_node_is_refused_in_one_line(submit):
    job = submit("data_at_scale.slurm", sbatch_args=["--nodes=1"])
    assert not job.ok
    assert "error: this job needs 2 nodes (sbatch --nodes=2), it has 1" in job.output


def _held_after_its_first_run(job_id: str, limit_s: float = 900) -> dict:
    """Poll until the job waits in the queue, held, after one run (its script requeued it held)."""
    t0 = time.time()
    while time.time() - t0 < limit_s:
        info = slurm_cluster.job_info(job_id)
        if info.get("JobState") not in (None, *WAITING):
            return info                                       # ended: not requeued, the asserts say why
        if info.get("JobState") == "PENDING" and info.get("Priority") == "0" and info.get("Restarts") == "1":
            return info
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], capture_output=True)
    raise TimeoutError(f"job {job_id} was not requeued held within {limit_s:.0f} s; cancelled")


def test_a_job_killed_mid_epoch_and_requeued_on_one_node_trains_every_sample_once(cluster, tmp_path):
    # The first run (2 nodes) holds after 9 steps with its snapshot saved and waits; the script
    # waits for that file (not for a length of training) and requeues the job held: Slurm kills
    # the training mid-epoch. Here, as a user would, the held job is set to 1 node and released.
    # The counts below come from the step logs both runs wrote (one file per rank and launch,
    # every id of every step), not from the job's summary. WORKSHOP_SITE=local as submit() sets it.
    work = tmp_path / "work"
    # $TMPDIR set, as Roihu sets it in every job: the script passes '$TMPDIR/...' and each node expands it
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    env = {**os.environ, "WORKSHOP_SITE": "local", "WORKDIR": str(work), "HOLD": "1",   # held, released here
           "TMPDIR": str(node_tmp)}
    job_id = slurm_cluster.sbatch(ROOT / "slurm" / "data_at_scale_requeue.slurm", env=env, cwd=ROOT,
                                  sbatch_args=["-o", f"{tmp_path}/%x-%j.out"])
    try:
        held = _held_after_its_first_run(job_id)
        if held.get("JobState") == "PENDING":
            line = re.search(r"after: (scontrol update JobId=\S+ NumNodes=1-1 NumTasks=1 NumCPUs=\d+) && "
                             r"(scontrol release \S+)", Path(held["StdOut"]).read_text())
            assert line, "the job's line that says how to release it"
            for cmd in (line.group(1).split(), line.group(2).split()):     # as printed, as a user types it
                # a change of node count makes scontrol write slurm_job_<id>_resize.{sh,csh} into
                # its working directory: the test's, not the repository
                res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
                assert res.returncode == 0, (cmd, res.stderr)
            info = slurm_cluster.wait(job_id, timeout=400)
        else:
            info = held
        output = Path(info.get("StdOut", "")).read_text() if info.get("StdOut") else ""
        print(f"job {job_id}: {info.get('JobState')}\n{output[-3000:]}")
        assert info.get("JobState") == "COMPLETED", output[-3000:]
        assert info.get("Restarts") == "1" and "run 2 of job" in output
        stop = re.search(r"holding: world_size=(\d+) after (\d+) of (\d+) samples of epoch 1", output)
        assert stop, output[-3000:]
        world1, stopped, n = map(int, stop.groups())
        assert 0 < stopped < n and world1 == 4                  # killed mid-epoch, on 2 nodes x 2
        assert f"run 2 of job {job_id} on 1 node(s)" in output
        # every node's copy went to its own expanded $TMPDIR, none to a directory named '$TMPDIR'
        staged_to = re.findall(r"^summary: node=(\S+) dir=(\S+) ", output, re.M)
        assert len(staged_to) >= 3 and all(d.startswith(f"{node_tmp}/") and node in d for node, d in staged_to), staged_to
        assert not (ROOT / "$TMPDIR").exists()                  # the job's working directory: the repository
        ids, launches = Counter(), {}
        for path in glob.glob(str(work / "logs" / "*.jsonl")):
            launch, _ = Path(path).stem.split("-rank")
            steps = [json.loads(line) for line in Path(path).read_text().splitlines()]
            launches.setdefault(launch, []).append(len(steps))
            for rec in steps:
                assert rec["epoch"] == 0
                ids.update(rec["ids"])
        worlds = sorted(int(re.search(r"w(\d+)$", launch).group(1)) for launch in launches)
        assert worlds == [2, 4], launches                       # 4 ranks before the kill, 2 after
        assert all(len(set(per_rank)) == 1 for per_rank in launches.values()), launches   # equal steps
        assert sum(ids.values()) == n and sorted(ids) == list(range(n)), "repeated or missing samples"
        assert sum(launches["e0s0w4"]) * 48 // 4 == stopped     # run 1 trained exactly to the snapshot
        summary = output[output.rindex("summary:"):]
        assert "resumed_from_world=4" in summary and "repeated=0 missing=0" in summary
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
        for d in glob.glob(f"/tmp/*-stage-*-{job_id}"):         # the nodes' copies (run 1's other node)
            shutil.rmtree(d, ignore_errors=True)
