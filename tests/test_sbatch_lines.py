"""Every `sbatch ...` line that a notebook or the README prints is submitted to the local Slurm
cluster, twice, the way a participant on a GPU site types it (all submitted at once, then each
job's end read: the two nodes run two one-node jobs side by side). The cluster declares GPUs
(tests/slurm_cluster.py) and the `local-gpu` profile asks for them:
* after the site step (`eval "$(python -m source_code.launch.site_profiles --site local-gpu
  --format exports)"`, run here in bash as a participant would), the line must run, and the job
  must say how many GPUs per node Slurm gave it;
* without the site step (WORKSHOP_SITE=local-gpu, none of its SBATCH_* variables), a line that
  runs one of the job scripts must stop in its first second, with exit status 2 and one line
  that names the site step, before any training.

The lines are collected from the files themselves (markdown and code cells of every notebook,
the README), so a line added, changed or mistyped there is what runs here. Each is submitted as
printed, with three changes only a test needs: a real site's resources
(`$(python -m source_code.launch.site_profiles --site S --gpus N --format args)`) become the
`local` profile's for the same number of GPUs (at most the cluster's 4 slots), `$SCRATCH` a
temporary directory, and sizes meant for GPUs (--dim 1024, --epochs 100, 256MiB ...) small ones;
without the site step, a script that runs on the CPU on purpose starts its fewest processes
(FEWEST below).
WORKSHOP_DATA points at a course directory with MNIST and WikiText-2 in their real formats
(tests/dataset_files.py), as a participant's environment would on a cluster.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import dataset_files  # noqa: E402

from source_code.course_plan import sbatch_lines  # noqa: E402
from source_code.launch import jobs, site_profiles  # noqa: E402
from source_code.training.loop import parse_summary  # noqa: E402

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]
SITE_ARGS = re.compile(r"\$\(python -m source_code\.launch\.site_profiles --site \w+ --gpus (\d+) "
                       r"--format args\)")
# GPU-sized flags and the values a 2-CPU test node runs in seconds
SMALL = {"--dim": "64", "--heads": "4", "--layers": "2", "--epochs": "2", "--steps": "10",
         "--max-size": "64KiB", "--snapshot-every": "5", "--timeout": "5", "--experts": "4",
         "--microbatches": "4"}
# a few steps of each entry point, appended where the line names no size (the last value wins)
SHORT = {"source_code.training.ddp": ["--epochs", "2"],
         "source_code.sharding.train": ["--epochs", "1", "--max-steps", "4"],
         "source_code.pipeline.train": ["--epochs", "1", "--samples", "512"],
         "source_code.tensor_parallel.train": ["--epochs", "1", "--max-steps", "4"],
         "source_code.mesh.train_2d": ["--steps", "6"],
         "source_code.sync.allreduce_benchmark": ["--ratio-size", "64KiB", "--ratio-reps", "3"],
         "frameworks": ["--epochs", "1", "--max-steps", "4"]}
# what the output of a line must show besides a successful exit (the launch line names the module)
EXPECT = {"source_code.pipeline.train": [", 2 nodes", "summary: world_size=4 epochs=1"],
          "source_code.sharding.train": [", 2 nodes", "summary: world_size=4 epochs=1"],
          "source_code.profiling.hang": ["hang_detected=1"],
          "FRAMEWORK=deepspeed": ["deepspeed ZeRO-3", "rendezvous c10d at n1:", "summary: world_size=4"],
          "FRAMEWORK=accelerate": ["accelerate (MULTI_CPU)", "summary: world_size=4"],
          "LAUNCHER=accelerate": ["accelerate.commands.launch --multi_gpu --num_machines 2 --machine_rank"],
          # Lightning's SLURMEnvironment forms the group from srun's variables, no torchrun
          "LAUNCHER=srun": ["world_size=2 (1 node(s) x 2), launched by srun", "summary: world_size=2 ",
                            " steps=4 "]}
# what the job of one line, exactly as printed, must also show (job id -> needles)
EXACT = {
    # notebook 05's multi-node line: one rendezvous over both nodes, one torchrun per node
    "sbatch slurm/ddp_multinode.slurm": lambda job_id: [
        f"rendezvous c10d at n1:{20000 + int(job_id) % 10000} id {job_id}, 2 nodes",
        "launch: srun --kill-on-bad-exit=1 --ntasks-per-node=1 ", "summary: world_size=4 epochs=2"],
    # notebook 12's 2D job: TP inside each node, FSDP2 across the two (the tp groups are read below)
    "sbatch slurm/tp_dp_2d.slurm": lambda job_id: [
        "mesh: dp=2 x tp=2, tp inside each of 2 nodes", "summary: world_size=4", " dp=2 tp=2 steps=6 "],
}
# lines that need a GPU: on the CPU cluster the job must stop at once with this one line
NEEDS_GPU = {"--snapshot": "needs a GPU"}


def module_of(env: dict, script: str) -> str:
    if "FRAMEWORK" in env:
        return "frameworks"
    if script.endswith("tp_dp_2d.slurm"):
        return "source_code.mesh.train_2d"
    if script.endswith("capstone.slurm"):   # its own module and sizes (a few steps already)
        return "source_code.capstone.choose"
    if script.endswith("resilience_torchft.slurm"):   # its own module and sizes
        return "source_code.resilience.ft_replica"
    if "data_at_scale" in script:   # its own module; its default is one epoch, the fewest
        return "source_code.data_at_scale.train"
    return env.get("TRAIN_MODULE", "source_code.training.ddp")


def _texts():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            yield f"{path.name[:2]}, cell {i}", "".join(cell["source"])
    yield "README", (ROOT / "README.md").read_text()


def printed_lines() -> dict[str, str]:
    """{command: where it is printed first}, continuation lines joined, comments left out (the
    course plan's column "prints sbatch lines" reads them the same way)."""
    found: dict[str, str] = {}
    for where, text in _texts():
        for cmd in sbatch_lines(text):
            found.setdefault(cmd, where)
    return found


def local_form(cmd: str, scratch: Path) -> tuple[dict, list[str], str, list[str]]:
    """(environment, sbatch options, script, script arguments) of ``cmd`` for the test cluster."""
    cmd = SITE_ARGS.sub(lambda m: " ".join(site_profiles.args(SITE, min(int(m.group(1)), 4))), cmd)
    cmd = cmd.replace("$SCRATCH", str(scratch))
    words = shlex.split(cmd)
    i = words.index("sbatch")
    env = dict(w.split("=", 1) for w in words[:i])
    rest = words[i + 1:]
    if "--wrap" in rest:  # the wrapped command, as the job script sbatch would write for it
        j = rest.index("--wrap")
        wrapped = scratch / "wrapped.sh"
        # the test cluster's GPUs are a count only: a command that asks for the GPUs it is given
        # (--device auto) would rightly stop at a node whose CUDA cannot start; here it runs on CPU
        command = rest[j + 1].replace("--device auto", "--device cpu")
        wrapped.write_text(f"#!/bin/bash\ncd {shlex.quote(str(scratch))}\n{command}\n")
        return env, rest[:j], str(wrapped), []
    j = next(k for k, w in enumerate(rest) if w.startswith("slurm/"))
    args = rest[j + 1:]
    for k, w in enumerate(args[:-1]):
        if w in SMALL:
            args[k + 1] = SMALL[w]
    short = SHORT.get(module_of(env, rest[j]), [])
    for flag, value in zip(short[::2], short[1::2]):
        if flag not in args:
            args += [flag, value]
    return env, rest[:j], str(ROOT / rest[j]), args


LINES = printed_lines()
ENDED: dict[str, dict] = {}  # job id -> its fields once it has ended
SITE = "local-gpu"


def site_step() -> dict:
    """The variables the site step sets, as `eval "$(...)"` sets them in a participant's bash."""
    cmd = (f'eval "$({shlex.quote(sys.executable)} -m source_code.launch.site_profiles --site {SITE} '
           '--format exports)" && env -0')
    res = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, check=True)
    after = dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)
    return {k: v for k, v in after.items() if k.startswith(("SBATCH_", "WORKSHOP_SITE"))}


def runs_a_job_script(cmd: str) -> bool:
    return "--wrap" not in cmd


# the lines that run a job script and carry no site options of their own: as typed without the
# site step, they must be refused, unless the script runs on the CPU on purpose
BARE = [c for c in LINES if runs_a_job_script(c) and not SITE_ARGS.search(c)]
CPU_ON_PURPOSE = "export WORKSHOP_DEVICE=${WORKSHOP_DEVICE:-cpu}"


def on_the_cpu_on_purpose(cmd: str) -> bool:
    script = next(w for w in shlex.split(cmd) if w.startswith("slurm/"))
    return CPU_ON_PURPOSE in (ROOT / script).read_text()


def script_default_args(script: str) -> list[str]:
    """The flags a job script passes when its line names none (`ARGS=(...)` in the script)."""
    found = re.search(r"^\[ \$\{#ARGS\[@\]\} -eq 0 \] && ARGS=\((.*)\)$", (ROOT / script).read_text(), re.M)
    assert found, f"{script}: no default ARGS=(...) line"
    return shlex.split(found.group(1))


def same_job_here(env: dict) -> dict:
    """The line's variables that change its job on the test cluster: its jobs use gloo on the
    CPU, where NCCL reads nothing, so NCCL_* variables are left out."""
    return {k: v for k, v in env.items() if not k.startswith("NCCL_")}


def effective_args(env: dict, script: str, args: tuple) -> tuple:
    """What the flags give the entry point, where it has parse_args: a GPU size made small that
    is the entry point's default is the same job as the line that names no size."""
    try:
        parsed = vars(importlib.import_module(module_of(env, script)).parse_args(list(args)))
    except (ImportError, AttributeError, SystemExit):
        return args
    return tuple(sorted((k, repr(v)) for k, v in parsed.items()))


# A script that runs on the CPU on purpose runs the same training with the site step or without
# it (the step only adds GPUs it leaves alone): the line with the step runs as printed, and
# without the step what is checked is the script's decision before its launch (allowed, and
# said) and that a launch follows and ends, so the bare form does the least the script takes:
# the capstone's 2 x 4 processes become 2 x 1, data parallel; notebook 18's methods, the four
# its summary line needs, at the script's own sizes
FEWEST = {"slurm/capstone.slurm": ({"NPROC_PER_NODE": "1"}, ["--dp", "2"]),
          "slurm/less_communication.slurm": ({}, [*script_default_args("slurm/less_communication.slurm"),
                                                  "--goals-only"])}


@pytest.fixture(scope="module")
def course_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("course-data")
    dataset_files.write_mnist(root, n_train=64, n_test=32)
    text = dataset_files.WIKI["train"] * 40
    dataset_files.write_wikitext(root, {"train": text, "valid": text[:2000], "test": text[:2000]})
    return root


def test_the_notebooks_print_sbatch_lines():
    assert len(LINES) >= 15, LINES
    assert any(w.startswith("README") for w in LINES.values())


@pytest.fixture(scope="module")
def submitted(cluster, course_data, tmp_path_factory) -> dict:
    """Every line submitted at once, both ways, as a class of participants would: Slurm runs them
    as its two nodes free up, and each test reads its job's end. The refusals go first: they end
    in a second. {(command, with_site_step): (job id or None, sbatch's refusal, scratch dir)}."""
    out, by_form = {}, {}
    base = tmp_path_factory.mktemp("sbatch-lines")
    step = site_step()
    assert step.get("WORKSHOP_SITE") == SITE and step.get("SBATCH_GPUS_PER_NODE"), step
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "WORKSHOP_SITE"))}
    ways = [(cmd, False) for cmd in BARE] + [(cmd, True) for cmd in LINES]
    for i, (cmd, with_step) in enumerate(ways):
        scratch = base / f"line{i:02d}"
        scratch.mkdir()
        try:
            env, options, script, args = local_form(cmd, scratch)
            if not with_step and runs_a_job_script(cmd) and on_the_cpu_on_purpose(cmd):
                more_env, more_args = FEWEST.get(str(Path(script).relative_to(ROOT)), ({}, []))
                env, args = {**env, **more_env}, [*args, *more_args]
        except (ValueError, StopIteration) as err:   # that line's test fails, naming it; the others run
            out[cmd, with_step] = (None, f"the printed line cannot be read as a command: {err!r}", scratch)
            continue
        # two lines that differ only in what the test cluster replaces (a site's resources, a
        # GPU size) or ignores (NCCL's variables) are one job here: submitted once, read by both
        form = (with_step, tuple(sorted(same_job_here(env).items())), tuple(options),
                Path(script).read_text() if script.startswith(str(scratch)) else script, tuple(args))
        twin = by_form.get(form) or next(
            (line for (*other, other_args), line in by_form.items() if tuple(other) == form[:-1]
             and effective_args(env, script, other_args) == effective_args(env, script, form[-1])), None)
        if twin:
            out[cmd, with_step] = out[twin]
            continue
        by_form[form] = (cmd, with_step)
        full_env = {**plain, "WORKSHOP_DATA": str(course_data), **(step if with_step else {"WORKSHOP_SITE": SITE}),
                    **env}
        if not runs_a_job_script(cmd):
            # a bare command has no profile to say that the test cluster's GPUs are a count only:
            # the device policy would (rightly) stop at a GPU node whose CUDA cannot start
            full_env["WORKSHOP_DEVICE"] = "cpu"
        try:
            job_id = jobs.sbatch(script, *args, env=full_env, cwd=ROOT,
                                 sbatch_args=["-o", f"{scratch}/%x-%j.out", *options])
            out[cmd, with_step] = (job_id, "", scratch)
        except subprocess.CalledProcessError as err:
            out[cmd, with_step] = (None, f"{err.stdout}{err.stderr}", scratch)
    yield out
    left = sorted({job_id for job_id, _, _ in out.values() if job_id})
    subprocess.run(["scancel", *left], capture_output=True)


def last_run(output: str) -> str:
    """The output of a job's last run. A requeued job (data_at_scale_requeue, ddp_fault_tolerant)
    appends each run to one log, and its scripts start each with `run N of job ...`. The runs
    before the last were killed on purpose (Slurm's SIGTERM to every process of the job), and a
    torchrun agent killed in its teardown may abort in torch's own code; the run that ends the job
    must end cleanly."""
    starts = [m.start() for m in re.finditer(r"^run \d+ of job \d+", output, re.M)]
    return output[starts[-1]:] if starts else output


def ended(job_id: str) -> jobs.Job:
    if job_id not in ENDED:  # a job two lines share is read once (the controller forgets it)
        ENDED[job_id] = jobs.wait(job_id, timeout=900)  # queued behind the lines before it, then run
    info = ENDED[job_id]
    out = Path(info.get("StdOut", ""))
    job = jobs.Job(job_id, info.get("JobState", "?"), info.get("ExitCode", "?"),
                   out.read_text() if out.is_file() else "", 0.0)
    print(f"job {job.id}: {job.state} in {info.get('RunTime', '?')}\n{job.output[-3000:]}")
    return job


@pytest.mark.parametrize("cmd", BARE, ids=[f"{LINES[c]}: {c[:60]}" for c in BARE])
def test_printed_sbatch_line_without_the_site_step_stops_in_one_line(cmd, submitted):
    job_id, refused, _ = submitted[cmd, False]
    assert job_id, f"{LINES[cmd]}: sbatch refused `{cmd}`: {refused}"
    job = ended(job_id)
    if on_the_cpu_on_purpose(cmd):   # allowed, and said
        assert job.ok and "note: WORKSHOP_DEVICE=cpu: the processes run on the CPU on purpose (0 GPU(s)" \
            in job.output, job.output[-3000:]
        return
    lines = job.output.strip().splitlines()
    assert job.exit_code.startswith("2:") and len(lines) == 1, job.output[-3000:]
    assert lines[0].startswith(f"error: site {SITE} runs on GPUs but job {job_id} was given none") \
        and "--format exports" in lines[0], lines


@pytest.mark.parametrize("cmd", list(LINES), ids=[f"{w}: {c[:60]}" for c, w in LINES.items()])
def test_printed_sbatch_line_runs_on_the_local_cluster(cmd, submitted):
    job_id, refused, scratch = submitted[cmd, True]
    assert job_id, f"{LINES[cmd]}: sbatch refused `{cmd}`: {refused}"
    job = ended(job_id)
    words = [w for token in shlex.split(cmd) for w in token.split()]   # --wrap "..." too
    refusal = next((line for flag, line in NEEDS_GPU.items() if flag in words), None)
    if refusal:  # stopped before any work, in one line that says why
        assert not job.ok and refusal in job.output and "Traceback" not in job.output, job.output[-3000:]
        return
    assert job.ok, f"{LINES[cmd]}: `{cmd}` ended {job.state}\n{job.output[-3000:]}"
    if runs_a_job_script(cmd):  # the job saw the GPUs the site step asked for
        assert re.search(r"process\(es\) per task, [1-9]\d* GPU\(s\) per node", job.output), job.output[-3000:]
    env = local_form(cmd, scratch)[0]
    if "TRAIN_MODULE" in env:
        assert f"-m {env['TRAIN_MODULE']}" in job.output, job.output[-3000:]
    for key, needles in EXPECT.items():
        if key in cmd:
            for needle in needles:
                assert needle in job.output, f"{LINES[cmd]}: no {needle!r} in\n{job.output[-3000:]}"
    if runs_a_job_script(cmd):   # ended cleanly, not only with exit status 0
        assert "terminate called" not in last_run(job.output), job.output[-3000:]
    for needle in EXACT.get(cmd, lambda _: [])(job.id):
        assert needle in job.output, f"{LINES[cmd]}: no {needle!r} in\n{job.output[-3000:]}"
    if cmd == "sbatch slurm/tp_dp_2d.slurm":   # one tp group per node, each inside its node
        groups = re.findall(r"tp group \[(\d+), (\d+)\] on (\S+)$", job.output, re.M)
        assert sorted(host for *_, host in groups) == ["n1", "n2"], job.output[-3000:]
        assert parse_summary(job.output)["loss"] < 3.0, job.output[-3000:]
    if cmd == "sbatch slurm/resilience_torchft.slurm":   # notebook 17's job: a node lost and healed
        assert re.search(r"lighthouse http://n1:\d+; groups on n1 and n2", job.output), job.output[-3000:]
        assert "replica 1: killed in the all-reduce of step 7" in job.output, job.output[-3000:]
        assert re.search(r"replica 1: back at step \d+, state received from a live peer", job.output), job.output[-3000:]
        summary = dict(re.findall(r"(\w+)=(\S+)", job.output.strip().splitlines()[-1]))
        assert summary["groups"] == "2" and summary["ft_steps_lost"] == "0", summary
        assert int(summary["ft_discarded_steps"]) >= 1 and summary["heal_bitwise_equal"] == "1", summary
