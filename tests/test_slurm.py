"""The job scripts of slurm/ submitted for real to a local two-node Slurm cluster (n1, n2).

The session fixture starts the cluster (tests/slurm_cluster.py: installs the Debian packages
when missing, slurmctld + two slurmd in their own UTS and mount namespaces) and stops it at the
end. Without root or namespaces the tests skip with the reason; with CI=true they fail instead.
Jobs run with the `local` site profile and the repository's real entry points.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402

from source_code.launch import jobs, site_profiles, sync_check  # noqa: E402
from source_code.training.loop import parse_summary  # noqa: E402

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "slurm"
SYNC = {"TRAIN_MODULE": "source_code.launch.sync_check"}


def ranks(output: str) -> list[tuple[int, int, str, str]]:
    """(rank, world, node, launcher) of every rank's report; lines of two ranks may be glued."""
    return sorted((int(r), int(w), n, la) for r, w, n, la in
                  re.findall(r"rank (\d+)/(\d+) local_rank=\d+ node=(\S+) launcher=(\S+)", output))


def assert_in_sync(output: str, world: int, nodes: int) -> dict:
    res = sync_check.parse(output)
    assert (res["world_size"], res["nodes"], res["in_sync"]) == (world, nodes, True)
    assert res["max_abs_diff"] < 1e-6  # DDP on the shards == one process on the global batch
    return res


# a single-node torchrun job (every rank reports, in sync): tests/test_job_from_a_job.py


def test_srun_one_task_per_gpu_without_torchrun(submit):
    job = submit("ddp_single_node_srun.slurm", env=SYNC)
    assert job.ok, job.output
    found = ranks(job.output)
    assert [(r, w, la) for r, w, _, la in found] == [(0, 2, "srun"), (1, 2, "srun")]
    assert re.search(r"MASTER_ADDR=(n1|n2) MASTER_PORT=\d+ tasks=2", job.output)
    assert_in_sync(job.output, world=2, nodes=1)


# the same multi-node script running other entry points (pipeline stages across both nodes,
# FSDP2 over 4 ranks, the frameworks): the lines notebooks 09, 10 and 16 print, submitted by
# tests/test_sbatch_lines.py


def test_multinode_inside_a_container_with_the_host_told_explicitly(submit, tmp_path):
    # no container runtime installs here: a stand-in with apptainer's command line
    # (exec [--bind DIR] IMAGE COMMAND...) that runs COMMAND as it is
    runtime = tmp_path / "fake-apptainer"
    runtime.write_text('#!/bin/bash\n[ "$1" = exec ] || exit 9; shift\n'
                       'while [ "$1" = --bind ]; do shift 2; done\nshift\nexec "$@"\n')
    runtime.chmod(0o755)
    image = tmp_path / "pytorch.sif"
    image.write_text("")
    env = {**SYNC, "WORKSHOP_CONTAINER": str(image), "CONTAINER_RUNTIME": str(runtime), "RDZV_IS_HOST": "yes"}
    # resources from the calculator, as a user would pass them: 4 "GPUs" = 2 nodes x 2 (the
    # plain line's rendezvous and launch lines: tests/test_sbatch_lines.py, notebook 05's line)
    job = submit("ddp_multinode.slurm", env=env, sbatch_args=site_profiles.args("local", 4))
    assert job.ok, job.output
    found = ranks(job.output)
    assert [r for r, *_ in found] == [0, 1, 2, 3] and {w for _, w, *_ in found} == {4}, job.output
    assert f"{runtime} exec --bind {ROOT} {image} torchrun" in job.output
    assert "--rdzv-conf=is_host=@IS_HOST@" in job.output  # per_node.sh: 1 on n1, 0 on n2
    assert sorted(n for *_, n, _ in ranks(job.output)) == ["n1", "n1", "n2", "n2"]
    assert_in_sync(job.output, world=4, nodes=2)


def test_master_and_worker_find_each_other_without_an_address(cluster, tmp_path):
    env = {**os.environ, "WORKSHOP_SITE": "local", **SYNC, "RDZV_FILE": str(tmp_path / "master.txt")}
    out = ["-o", f"{tmp_path}/%x-%j.out"]
    master = slurm_cluster.sbatch(SCRIPTS / "ddp_master_node.sh", env=env, cwd=ROOT, sbatch_args=out)
    worker = slurm_cluster.sbatch(SCRIPTS / "ddp_worker_node.sh", env=env, cwd=ROOT, sbatch_args=out)
    infos = [slurm_cluster.wait(j, timeout=150) for j in (master, worker)]
    m_out, w_out = (Path(i["StdOut"]).read_text() for i in infos)
    print(m_out, w_out)
    assert [i["JobState"] for i in infos] == ["COMPLETED", "COMPLETED"], m_out + w_out
    host, port = re.search(r"master: rendezvous at (\S+):(\d+)", m_out).groups()
    assert f"joining master {host}:{port} (job {master})" in w_out
    assert {infos[0]["NodeList"], infos[1]["NodeList"]} == {"n1", "n2"}
    assert_in_sync(m_out, world=4, nodes=2)
    assert not (tmp_path / "master.txt").exists()  # the master cleans up its address


def test_worker_without_master_fails_with_a_clear_message(submit, tmp_path):
    job = submit("ddp_worker_node.sh", env={"RDZV_FILE": str(tmp_path / "none.txt"), "MASTER_WAIT": "2"})
    assert job.state == "FAILED" and job.exit_code == "3:0"
    assert "error: no master found" in job.output and "start slurm/ddp_master_node.sh first" in job.output


def test_unknown_partition_is_refused_by_slurm(cluster):
    with pytest.raises(subprocess.CalledProcessError) as err:
        slurm_cluster.sbatch(SCRIPTS / "ddp_single_node.slurm", sbatch_args=["--partition=gpu"], cwd=ROOT)
    assert "invalid partition specified: gpu" in err.value.stderr


def test_fault_tolerant_main_job_restarts_and_resumes(submit, tmp_path):
    ckpt = tmp_path / "snap.pt"
    job = submit("ddp_fault_tolerant.slurm", "--epochs", "2", "--max-steps", "4", "--crash-at-step", "6",
                 env={"CHECKPOINT": str(ckpt), "MAX_RESTARTS": "1"})
    assert job.ok, job.output
    assert "rank 1: simulated failure after global step 6 (SIGKILL)" in job.output
    assert f"resumed from {ckpt} after epoch 1" in job.output
    summary = parse_summary(job.output[job.output.index("summary:"):])
    assert (summary["world_size"], summary["epochs"]) == (2, 2)


def _until_logged(job_id: str, log: Path, text: str, limit_s: float = 1800) -> bool:
    """Poll (0.5 s) until ``text`` is in the job's log; False if the job leaves the queue first.
    ``limit_s`` only bounds a job that never starts (it may wait behind the other worker's jobs)."""
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if log.is_file() and text in log.read_text():
            return True
        if slurm_cluster.job_info(job_id).get("JobState") not in (None, *jobs.WAITING):
            return log.is_file() and text in log.read_text()
        time.sleep(0.5)
    return False


def _set_time_limit(job_id: str, minutes: int) -> None:
    # as root (the test cluster's user): an owner may only lower a job's limit
    res = subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _seconds(runtime: str) -> int:
    """scontrol's RunTime, [days-]hours:minutes:seconds, in seconds."""
    days, _, hms = runtime.rpartition("-")
    h, m, s = map(int, hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def test_fault_tolerant_job_requeues_itself_before_the_time_limit_and_resumes(cluster, tmp_path):
    # The first run trains 2 epochs and then waits until the trap stops it
    # (source_code.launch.requeue_drill), standing for a training longer than the limit. Its
    # limit is set only once it holds, to end a minute or two later, so that the warning finds it
    # holding however long its start and 2 epochs took (a busy machine). USR1 comes 30 s before
    # the limit (Slurm's timer may send it up to a minute early: the trap then waits with a timer
    # for 30 s before the limit); the trap waits 3 s for the epoch in progress to be saved, stops
    # the training and requeues: same id, same log (--open-mode=append). The next run gets a long
    # limit back, resumes after epoch 2 and ends.
    ckpt, epochs, lead = tmp_path / "snap.pt", 6, 30
    env = {**os.environ, "WORKSHOP_SITE": "local", "CHECKPOINT": str(ckpt), "MAX_REQUEUES": "8",
           "REQUEUE_GRACE": "3", "REQUEUE_LEAD": str(lead), "TRAIN_MODULE": "source_code.launch.requeue_drill"}
    job_id = slurm_cluster.sbatch(SCRIPTS / "ddp_fault_tolerant.slurm", "--epochs", epochs, "--max-steps", 1,
                                  "--hold-after-epoch", 2, env=env, cwd=ROOT,
                                  sbatch_args=["-o", f"{tmp_path}/%x-%j.out", "--time=10",
                                               f"--signal=B:USR1@{lead}"])
    log = tmp_path / f"ddp-fault-tolerant-{job_id}.out"
    try:
        assert _until_logged(job_id, log, "holding after epoch 2: this run waits until the job stops it"), \
            log.read_text() if log.is_file() else "no log"
        ran = _seconds(slurm_cluster.job_info(job_id)["RunTime"])
        _set_time_limit(job_id, -(-(ran + lead + 5) // 60))   # whole minutes: 35-95 s from now
        assert _until_logged(job_id, log, f"requeueing job {job_id}; run 2 resumes from {ckpt}"), log.read_text()
        _set_time_limit(job_id, 10)
        info = slurm_cluster.wait(job_id, timeout=900)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    output = log.read_text()
    print(f"job {job_id}: {info['JobState']}, {info['Restarts']} restart(s)\n{output[-3000:]}")
    # COMPLETED, not TIMEOUT: the first run was stopped and requeued by its trap before the limit
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1 and "run 2 of job" in output, output[-3000:]
    assert re.search(r"time limit near: stopping the training after waiting \d+s", output)
    resumed = [int(e) for e in re.findall(rf"resumed from {re.escape(str(ckpt))} after epoch (\d+)", output)]
    assert resumed and resumed[0] == 2, output[-3000:]
    summary = parse_summary(output[output.rindex("summary:"):])
    assert summary["epochs"] == epochs and summary["world_size"] == 2


def test_the_site_step_with_a_reservation_submits_into_its_partition_and_nodes(submit):
    """A course's reservation (made here as an instructor would, in the `course` partition, on
    n2 only): the site step takes its name, and its partition replaces the profile's `debug`."""
    name = "workshop_course"
    subprocess.run(["scontrol", "delete", f"ReservationName={name}"], capture_output=True)
    # IGNORE_JOBS: the other test worker's jobs may be running on n2 at this moment; without it
    # scontrol refuses ("Requested nodes are busy") and the job below would not wait for them.
    made = subprocess.run(["scontrol", "create", "reservation", f"ReservationName={name}", "Users=root",
                           "Nodes=n2", "StartTime=now", "Duration=30", "PartitionName=course",
                           "Flags=IGNORE_JOBS"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr + made.stdout
    try:
        cmd = (f'eval "$({sys.executable} -m source_code.launch.site_profiles --site local-gpu '
               f'--reservation {name} --format exports)" && env -0')
        res = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, check=True)
        got = dict(kv.split("=", 1) for kv in res.stdout.split("\0") if kv.startswith("SBATCH_"))
        assert (got["SBATCH_RESERVATION"], got["SBATCH_PARTITION"]) == (name, "course"), got
        # what runs does not matter here, only where: a module that reads its environment only
        job = submit("ddp_single_node.slurm", env={**got, "WORKSHOP_SITE": "local-gpu",
                                                   "TRAIN_MODULE": "source_code.launch.whoami"})
        assert job.ok and re.search(r"^job \d+ on n2: site local-gpu", job.output, re.M), job.output
        bad = subprocess.run([sys.executable, "-m", "source_code.launch.site_profiles", "--site", "local-gpu",
                              "--reservation", "no_such_course", "--format", "exports"],
                             capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stderr.startswith("error: no reservation 'no_such_course'")
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName={name}"], capture_output=True)
