"""Notebook 20's package: the cursor's arithmetic and the splits, the file-system counter, staging,
the loaders' resume, the exercise's check, and the entry points' summary lines."""
from __future__ import annotations

import inspect
import os
import pathlib
import re
import shutil
import sys

import pytest

from source_code.data_at_scale import cursor, formats, fsops, samplers, staging, train
from source_code.errors import LaunchError
from source_code.data_at_scale.drills import count
from source_code.data_at_scale.exercise import check_rank_batches, problem
from source_code.solutions.nb20_data_at_scale import PAD, rank_batches

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import spawned_main  # noqa: E402  tests/: an entry point's main in a rank of processes.spawn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------- the global cursor
def _epoch(c: cursor.GlobalCursor, world: int, steps: int | None = None) -> list[list[list[int]]]:
    """Per step, every rank's ids from the cursor (to the epoch's end or for ``steps`` steps)."""
    epoch, out = c.epoch, []
    while c.epoch == epoch and (steps is None or len(out) < steps):
        out.append([c.batch_for(r, world) for r in range(world)])
        c.advance()
    return out


@pytest.mark.parametrize("n,batch,before,after,stop", [(1210, 48, 4, 3, 9), (1210, 48, 2, 4, 25),
                                                       (100, 12, 3, 1, 1), (97, 12, 6, 2, 7), (48, 48, 4, 2, 0)])
def test_a_resume_on_another_world_size_trains_every_sample_once(n, batch, before, after, stop):
    c = cursor.GlobalCursor(n, batch, seed=3)
    first = _epoch(c, before, stop)
    resumed = cursor.GlobalCursor(n, batch, seed=3)
    resumed.load_state_dict(c.state_dict())                 # what the snapshot carries
    second = _epoch(resumed, after)
    ids = [i for step in first + second for rank in step for i in rank if i != cursor.PAD]
    assert count(ids, n) == {"seen": n, "unique": n, "repeated": 0, "missing": 0}
    assert all(len(rank) == batch // w for part, w in ((first, before), (second, after))
               for step in part for rank in step)
    assert resumed.epoch == 1 and resumed.consumed == 0
    pads = [i for step in second[:-1] for rank in step for i in rank if i == cursor.PAD]
    assert not pads, "pads only in the epoch's last global batch"


def test_the_global_batches_are_those_of_a_run_that_never_stopped():
    plain = _epoch(cursor.GlobalCursor(500, 24, seed=1), 4)
    c = cursor.GlobalCursor(500, 24, seed=1)
    head = _epoch(c, 4, 7)
    tail = _epoch(c, 3)
    for a, b in zip(plain, head + tail):
        assert sorted(i for r in a for i in r if i != cursor.PAD) == sorted(i for r in b for i in r if i != cursor.PAD)


def test_the_epoch_order_depends_on_the_epoch_and_seed_only():
    assert cursor.epoch_order(50, 2, 1) == cursor.epoch_order(50, 2, 1)
    assert cursor.epoch_order(50, 2, 1) != cursor.epoch_order(50, 3, 1)
    assert sorted(cursor.epoch_order(50, 0, 0)) == list(range(50))


def test_a_cursor_refuses_a_batch_that_does_not_split_and_another_dataset():
    c = cursor.GlobalCursor(100, 10)
    with pytest.raises(ValueError, match="does not split over 4 ranks"):
        c.batch_for(0, 4)
    with pytest.raises(ValueError, match="counts an epoch of 100 samples"):
        cursor.GlobalCursor(99, 10).load_state_dict(c.state_dict())


# ------------------------------------------------------------------------- splits
SHARDS = [list(range(s, min(s + 128, 1210))) for s in range(0, 1210, 128)]


def test_by_shard_gives_whole_shards_and_unequal_steps():
    per_rank = [cursor.by_shard(SHARDS, r, 4) for r in range(4)]
    assert [len(ids) for ids in per_rank] == [384, 314, 256, 256]
    assert count([i for ids in per_rank for i in ids], 1210)["missing"] == 0
    assert len({cursor.steps(ids, 16) for ids in per_rank}) > 1


def test_by_shard_is_webdatasets_split_by_node(tmp_path, monkeypatch):
    urls = formats.write_shards(formats.make_samples(300), tmp_path, per_shard=40)
    shards = [list(range(s, min(s + 40, 300))) for s in range(0, 300, 40)]
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert sorted(formats.load_shards(urls, split=True)) == cursor.by_shard(shards, rank, 3)


@pytest.mark.parametrize("n,world", [(1210, 4), (7, 3), (12, 4), (5, 8)])
def test_dropping_and_padding_make_equal_counts_and_say_what_they_cost(n, world):
    ids = list(range(n))
    dropped = [cursor.by_sample(ids, r, world, fix="drop") for r in range(world)]
    padded = [cursor.by_sample(ids, r, world, fix="pad") for r in range(world)]
    assert len({len(x) for x in dropped}) == 1 and len({len(x) for x in padded}) == 1
    assert count([i for x in dropped for i in x], n)["missing"] == n % world
    real = [i for x in padded for i in x if i != cursor.PAD]
    assert count(real, n) == {"seen": n, "unique": n, "repeated": 0, "missing": 0}
    assert sum(x.count(cursor.PAD) for x in padded) == -n % world


# ------------------------------------------------------------------------- what a reader asks
def test_the_counter_sees_each_readers_requests_and_nothing_outside_its_root(tmp_path):
    paths = formats.write_all(formats.make_samples(60), tmp_path / "shared", per_shard=25)
    rows = {name: fsops.epoch(reader, src, tmp_path / "shared") for name, reader, src in
            [("loose", formats.read_loose, str(paths["loose"])), ("shards", formats.read_shards, paths["shards"]),
             ("arrow", formats.read_arrow, str(paths["arrow"]))]}
    assert (rows["loose"]["opens"], rows["loose"]["listings"]) == (60, 1)
    assert rows["shards"]["opens"] == 3 and rows["arrow"]["opens"] == 1
    assert len({r["digest"] for r in rows.values()}) == 1, "the layouts hold the same samples"
    with fsops.counting(tmp_path / "shared") as ops:
        os.path.exists(paths["array"])
        pathlib.Path(paths["array"]).exists()
        pathlib.Path(paths["arrow"]).is_file()
        os.path.exists(tmp_path)                            # outside the root: not counted
        open(paths["array"], "rb").close()
    assert (ops.stats, ops.opens) == (3, 1)
    assert os.stat is fsops.os.stat and "counted" not in repr(os.stat), "os.stat is restored"
    # the modelled waiting depends on the counts only (the CPU time that on_shared adds does not)
    wait = {name: fsops.waiting(row["requests"], row["bytes"]) for name, row in rows.items()}
    assert wait["loose"] > wait["shards"]


# ------------------------------------------------------------------------- staging
def test_staging_copies_once_and_a_cut_copy_is_made_again(tmp_path, monkeypatch):
    urls = formats.write_shards(formats.make_samples(100), tmp_path, per_shard=30)
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    target = staging.node_dir(str(tmp_path / "stage-{node}"))
    assert target.endswith("stage-n7")
    with fsops.counting(tmp_path / "shards") as ops:
        first = staging.stage(tmp_path / "shards", target)
    assert first["copied"] and first["files"] == len(urls) and ops.opens == len(urls) and ops.listings == 1
    assert staging.staged(target) == [os.path.basename(u) for u in urls]
    assert not staging.stage(tmp_path / "shards", target)["copied"]
    os.remove(os.path.join(target, staging.MARK))          # a copy cut off before its list
    assert staging.stage(tmp_path / "shards", target)["copied"]
    assert staging.break_even(3.0, 2.0, 0.5) == 2.0 and staging.break_even(1.0, 0.5, 0.5) == float("inf")


@pytest.mark.parametrize("nodes", [2, 4])
def test_on_n_nodes_each_node_copies_everything_reads_its_share_and_pays_back_n_times_later(tmp_path, nodes):
    from source_code.data_at_scale import report
    prep = report.prepare(tmp_path, n=256, per_shard=32)          # 8 shards: each node gets 8 / nodes
    for row in report.staging_costs(prep, nodes=nodes):
        assert row["bytes"] == row["epoch_bytes"]                    # the copy: all of it, on every node
        assert 0.9 < row["node_bytes"] * nodes / row["bytes"] < 1.1, row
        assert 0.9 * nodes < row["node_break_even"] / row["break_even"] < 1.1 * nodes, row
        # segmented: node 0 copies exactly what it reads, and pays back after about one epoch
        assert (row["part_requests"], row["part_bytes"]) == (row["node_requests"], row["node_bytes"]), row
        assert 0.8 < row["part_break_even"] / row["break_even"] < 1.1, row


def test_segmented_data_need_fit_only_the_nodes_space_together():
    lumi = {site: ok for site, _, ok, _ in staging.fits(1000)}["LUMI standard-g"]
    parts = {site: ok for site, _, ok, _ in staging.fits(1000, nodes=4)}
    assert not lumi and parts["LUMI standard-g"] and not parts["LUMI small-g"]   # 250 GB a node: 460, 64


def test_staging_without_shards_is_refused_in_one_line(tmp_path):
    with pytest.raises(LaunchError, match="is not a directory; write the shards first"):
        staging.main(["--from", str(tmp_path / "none"), "--to", str(tmp_path / "x")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(LaunchError, match="nothing to stage in"):
        staging.main(["--from", str(tmp_path / "empty"), "--to", str(tmp_path / "x")])


def test_the_stage_directory_expands_each_nodes_variables_and_refuses_an_unset_one(tmp_path, monkeypatch):
    # what the job scripts pass single-quoted: each node expands its own $TMPDIR, not the batch host
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    monkeypatch.setenv("NODE_TMP", str(tmp_path / "local"))
    for template in ("$NODE_TMP/stage-{node}", "${NODE_TMP}/stage-{node}"):
        assert staging.node_dir(template) == str(tmp_path / "local" / "stage-n3")
    (tmp_path / "shards").mkdir()
    formats.write_shards(formats.make_samples(40), tmp_path, per_shard=20)
    staging.main(["--from", str(tmp_path / "shards"), "--to", "$NODE_TMP/stage-{node}"])
    assert staging.staged(tmp_path / "local" / "stage-n3") and not (pathlib.Path.cwd() / "$NODE_TMP").exists()
    monkeypatch.delenv("NODE_TMP")
    with pytest.raises(LaunchError, match=r"names \$NODE_TMP, which is not set on n3: set it, or give"):
        staging.main(["--from", str(tmp_path / "shards"), "--to", "$NODE_TMP/stage-{node}"])
    with pytest.raises(LaunchError, match="may hold {node} and no other"):
        staging.node_dir(str(tmp_path / "stage-{host}"))


MOUNTS = """/dev/nvme0n1 / ext4 rw 0 0
10.0.0.1@o2ib:/scratch /scratch lustre rw 0 0
tmpfs /tmp tmpfs rw 0 0
jurecafs /p gpfs rw 0 0
"""


@pytest.mark.parametrize("directory, fs", [("/scratch/project_1/stage-n1", "lustre"), ("/p/scratch/x", "gpfs")])
def test_a_stage_directory_on_a_shared_file_system_is_refused_before_the_copy(directory, fs):
    assert staging.file_system(directory, MOUNTS)[1] == fs
    with pytest.raises(LaunchError, match=f"on the shared {fs} file system .*set STAGE_DIR"):
        staging.check_target(directory, mounts=MOUNTS)
    staging.check_target("/tmp/stage-n1", mounts=MOUNTS)          # LUMI's /tmp, in memory: the node's own
    assert staging.file_system("/tmp/stage-n1", MOUNTS) == ("/tmp", "tmpfs")


def test_a_stage_directory_too_small_or_not_writable_is_refused(tmp_path, monkeypatch):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(LaunchError, match="do not fit in .* GB free\\): stage each node's part only"):
        staging.check_target(tmp_path / "stage", need_bytes=free + 10**9)
    staging.check_target(tmp_path / "stage", need_bytes=1)
    monkeypatch.setattr(staging.os, "access", lambda path, mode: False)
    with pytest.raises(LaunchError, match="cannot write .* is not writable"):
        staging.check_target(tmp_path / "stage")


# ------------------------------------------------------------------------- the loaders' resume
def test_per_rank_loader_states_repeat_on_a_smaller_world_and_skip_on_a_larger_one():
    shrink = {(r["loader"], r["rule"]): r for r in samplers.compare(600, 4, 3, 5, 12)}
    grow = {(r["loader"], r["rule"]): r for r in samplers.compare(600, 3, 4, 5, 16)}
    key = ("DistributedSampler, skip the steps done", "per-rank batch kept")
    assert shrink[key]["repeated"] == 5 * 12 and shrink[key]["missing"] == 0
    assert grow[key]["missing"] > 0
    assert shrink["torchdata StatefulDataLoader", "global batch kept"]["repeated"] > 0
    for table in (shrink, grow):
        for rule in ("per-rank batch kept", "global batch kept"):
            assert table["global cursor", rule]["repeated"] == table["global cursor", rule]["missing"] == 0


# ------------------------------------------------------------------------- the exercise
def test_the_reference_passes():
    assert check_rank_batches(rank_batches).startswith("correct")


def _interleaved(n, consumed, batch, rank, world):       # the same global batches, dealt out rank by rank
    per, out = batch // world, []
    for start in range(consumed, n, batch):
        mine = list(range(start, min(start + batch, n)))[rank::world]
        out.append(tuple(mine) + (PAD,) * (per - len(mine)))
    return out


def test_a_right_answer_written_another_way_passes():
    # each global batch dealt out rank by rank, as DistributedSampler deals: the same positions per step
    assert check_rank_batches(_interleaved).startswith("correct")


def _restart(n, consumed, batch, rank, world):
    return rank_batches(n, 0, batch, rank, world)


def _no_padding(n, consumed, batch, rank, world):
    return [[p for p in b if p != PAD] for b in rank_batches(n, consumed, batch, rank, world) if set(b) != {PAD}]


def _drop_the_last(n, consumed, batch, rank, world):
    return rank_batches(n, consumed, batch, rank, world)[:(n - consumed) // batch]


def _chunks(n, consumed, batch, rank, world):             # exactly once and equal steps, other batches
    per = batch // world
    size = -(-(n - consumed) // world)
    mine = list(range(consumed + rank * size, min(consumed + (rank + 1) * size, n)))
    mine += [PAD] * (-(-size // per) * per - len(mine))
    return [mine[i:i + per] for i in range(0, len(mine), per)]


def _off_by_one(n, consumed, batch, rank, world):          # the rest counted from the position after the cursor
    return rank_batches(n, consumed + 1, batch, rank, world)


def _floor_plus_one(n, consumed, batch, rank, world):      # steps = (n - consumed) // batch + 1
    got = rank_batches(n, consumed, batch, rank, world)
    return got + [[PAD] * (batch // world)] * ((n - consumed) // batch + 1 - len(got))


@pytest.mark.parametrize("fn,message", [
    (_floor_plus_one, "trains no sample on any rank"),
    (_restart, "positions before the cursor come again"),
    (_no_padding, "different numbers of steps"),
    (_drop_the_last, "last, short global batch is left out"),
    (_chunks, "than the global batch a run without the stop trains"),
    (_off_by_one, "never trained"),
])
def test_typical_wrong_answers_are_named(fn, message):
    verdict = check_rank_batches(fn)
    assert verdict.startswith("not yet") and message in verdict, verdict


def test_the_check_never_raises_and_runs_configurations_the_notebook_never_prints():
    def broken(*args):
        raise KeyError("x")
    assert check_rank_batches(broken).startswith("rank_batches raised KeyError")
    from source_code.data_at_scale import report
    shown = (inspect.signature(report.prepare).parameters["n"].default, report.STOP_AFTER * report.GLOBAL_BATCH,
             report.GLOBAL_BATCH)
    asked = []

    def watched(n, consumed, batch, rank, world):     # the configurations the check really runs
        asked.append((n, consumed, batch, world))
        return rank_batches(n, consumed, batch, rank, world)
    assert check_rank_batches(watched).startswith("correct")
    assert len(set(asked)) > 3 and not [c for c in asked if c[:3] == shown], "the notebook's own resume"
    assert all(consumed % batch == 0 for _, consumed, batch, _ in asked), "a job stops between global steps"
    assert problem([[[0, 1]], [[2, PAD]]], 3, 0, 4, 2) == ""


# ------------------------------------------------------------------------- entry points
def _summary(text: str) -> dict:
    line = [ln for ln in text.splitlines() if ln.startswith("summary:")][-1]
    return dict(re.findall(r"(\w+)=(\S+)", line))


@pytest.mark.slow
def test_the_report_ends_with_the_notebooks_summary_line(capsys):
    """The report's main in this process (its ranks forked from the fork server this process
    already has, not from a new interpreter's own: the same parts, a few CPU-seconds less)."""
    from source_code.data_at_scale import report
    assert report.main(["--samples", "500", "--per-shard", "50"]) == 0
    s = _summary(capsys.readouterr().out)
    assert s["opens_ratio"] == "50" and float(s["modelled_lustre_speedup"]) > 1, s
    assert s["uneven_steps_equal"] == "1" and s["uneven_hang_caught"] == "1", s
    assert s["resume_repeated"] == s["resume_missing"] == "0" and int(s["sampler_resume_repeated"]) > 0, s


def test_the_training_stops_on_two_processes_and_resumes_on_one_exactly_once(tmp_path):
    """The script's main on 2 forked ranks, then on 1 (under torchrun: notebook 20's Slurm lines)."""
    from source_code.processes import spawn
    formats.write_shards(formats.make_samples(300), tmp_path, per_shard=64)
    args = ["--shards", tmp_path / "shards", "--stage-dir", tmp_path / "stage-{node}", "--checkpoint",
            tmp_path / "snap.pt", "--log-dir", tmp_path / "logs", "--global-batch", "24", "--epochs", "2"]

    def launch(nproc, *more):
        ranks = spawn(spawned_main.session_main, nproc, "source_code.data_at_scale.train", *args, *more,
                      device="cpu", stream=False)
        assert [code for code, _ in ranks] == [0] * nproc, ranks
        return "".join(out for _, out in ranks)
    first = launch(2, "--stop-after-steps", 5)
    assert _summary(first) == {"world_size": "2", "stopped_at": "120", "epoch": "0", "samples": "300"}
    second = launch(1, "--resume")
    s = _summary(second)
    assert "resumed: world_size=1 from a snapshot of world_size=2 at epoch 1, sample 120 of 300" in second
    assert (s["epochs"], s["launches"], s["repeated"], s["missing"], s["steps_equal"]) == ("2", "2", "0", "0", "1"), s


def test_a_global_batch_that_does_not_split_is_refused_before_any_work(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")        # as torchrun sets it, before any process group forms
    with pytest.raises(LaunchError, match="--global-batch 5 does not split over 2 processes; pick a multiple of 2"):
        train.main(["--global-batch", "5"])


def test_the_requeue_drills_hold_needs_a_snapshot_to_resume_from():
    with pytest.raises(LaunchError, match="--hold-after-steps needs --checkpoint and --resume"):
        train.main(["--hold-after-steps", "3"])


def test_a_requeued_run_does_not_hold_again(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    seen = {}
    monkeypatch.setattr(train, "default_dirs", lambda args: seen.update(hold=args.hold_after_steps) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        train.main(["--hold-after-steps", "3", "--checkpoint", str(tmp_path / "s.pt"), "--resume"])
    assert seen == {"hold": 0}


# ------------------------------------------------------------------------- litdata (resharding)
def test_without_litdata_the_notebook_prints_one_line(monkeypatch):
    from source_code.data_at_scale import resharding
    monkeypatch.setattr(resharding.importlib.util, "find_spec", lambda name: None)
    note = resharding.missing_note()
    assert note.startswith("note: litdata is not installed") and "\n" not in note


def test_litdatas_resume_is_exact_with_the_global_batch_kept_and_rounds_down_when_it_grows():
    pytest.importorskip("litdata")
    from source_code.data_at_scale import resharding
    cases = ((4, 3, "global batch kept"), (3, 4, "global batch kept"), (4, 2, "per-rank batch kept"),
             (3, 4, "per-rank batch kept"))
    rows = resharding.compare(500, 5, 24, cases=cases, per_chunk=64)
    for row in rows[:2]:
        assert row["repeated"] == 0 and row["same_as_without_stop"], row
    for row in rows[2:]:   # the position rounded down to a multiple of the new global batch
        assert row["repeated"] == row["stopped_at"] % row["batches"][1], row
    assert rows[3]["repeated"] > 0 and rows[2]["repeated"] == 0      # stopped at 120: 120 % 32 = 24, 120 % 12 = 0


@pytest.mark.parametrize("world", [1, 3, 4])
def test_the_cursors_loss_averaged_over_the_ranks_is_the_global_batchs_mean(world):
    from source_code.data_at_scale import model as mdl
    samples, net = formats.make_samples(58), mdl.build(dim=16, layers=1, seed=0)
    c = cursor.GlobalCursor(58, 12, seed=0)
    while c.steps_left() > 1:
        c.advance()                                     # the epoch's last, short global batch: 10 of 12
    per_rank = [mdl.weighted_loss(net, *mdl.collate(samples, c.batch_for(r, world)), c.real_in_batch() / world)
                for r in range(world)]
    real = [i for r in range(world) for i in c.batch_for(r, world) if i != cursor.PAD]
    assert len(real) == c.real_in_batch() < 12
    mean = mdl.sample_losses(net, *mdl.collate(samples, real)[:2]).mean()
    assert abs(float((sum(per_rank) / world - mean).detach())) < 1e-5     # DDP's mean of the ranks' losses


# ------------------------------------------------------------------------- Join's stale state
def _rank_after_uneven_steps(rank: int):
    """What rank ``rank`` of a Join epoch holds: rank + 1 steps of AdamW with an LR schedule and
    a GradScaler (the early ranks skipped the last ones)."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    for k in range(rank + 1):
        loss = model(torch.full((2, 3), float(k + 1))).sum()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
    return opt, sched, scaler


def _held(opt, sched, scaler) -> dict:
    return {"lr": opt.param_groups[0]["lr"], "sched_lr": sched.get_last_lr()[0], "epoch": sched.last_epoch,
            "scale": scaler.get_scale(), "exp_avg": opt.state_dict()["state"][0]["exp_avg"].tolist()}


def test_sync_optimizer_gives_rank_0_the_last_ranks_schedule_and_loss_scale_when_passed_them(monkeypatch):
    """Rank 0 of two, the collectives played by rank 1 (one step more): what the broadcast
    carries is pickled, as broadcast_object_list does."""
    import pickle
    import torch.distributed as dist
    from source_code.data_at_scale import loops
    last = _held(*_rank_after_uneven_steps(1))

    def gather(out, steps):
        out[:] = [steps, 2]

    def broadcast(states, src):
        assert src == 1
        states[0] = pickle.loads(pickle.dumps(_rank_states[0]))

    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_gather_object", gather)
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)
    for passed in (False, True):
        owners = _rank_after_uneven_steps(1)
        _rank_states[:] = [loops._on_cpu([o.state_dict() for o in (owners if passed else owners[:1])])]
        mine = _rank_after_uneven_steps(0)
        before = _held(*mine)
        assert before["epoch"] != last["epoch"] and before["scale"] != last["scale"]
        loops.sync_optimizer(mine[0], 1, *(mine[1:] if passed else ()))
        now = _held(*mine)
        if passed:   # rank 0 now holds rank 1's optimizer, schedule and loss scale
            assert now == last, now
        else:        # the optimizer alone: its moments follow, the schedule's count and the loss scale do not
            assert now["exp_avg"] == last["exp_avg"] and (now["epoch"], now["scale"]) == (before["epoch"], before["scale"])


_rank_states: list = []


def test_sync_optimizer_pickles_cpu_copies_of_the_state():
    import torch
    from source_code.data_at_scale.loops import _on_cpu
    state = {"state": {0: {"exp_avg": torch.ones(2), "step": torch.tensor(3.0)}}, "groups": [(torch.zeros(1), 0.5)]}
    moved = _on_cpu(state)
    assert moved["state"][0]["exp_avg"].device.type == moved["groups"][0][0].device.type == "cpu"
    assert isinstance(moved["groups"][0], tuple) and moved["groups"][0][1] == 0.5
    assert moved["state"][0]["step"].item() == 3.0 and moved["state"][0]["exp_avg"].tolist() == [1.0, 1.0]
