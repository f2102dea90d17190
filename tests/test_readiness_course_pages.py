"""The pages for a course at an HPC centre (notebooks/PRE_COURSE_MESSAGE.md, LAB_ON_A_CLUSTER.md,
SLOW_QUEUE.md, COURSE_DAY.md) say what the code does: the readiness row they name, the site
profiles' test partitions and limits, the site step's --test, the job scripts' time limits, and
the notebooks' sections that COURSE_DAY.md's cuts name. Cheap: no process is started."""
import json
import math
import re
import shlex
from pathlib import Path

import pytest

from source_code import course_plan, readiness
from source_code.launch import site_profiles, site_step

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PAGES = ["PRE_COURSE_MESSAGE.md", "LAB_ON_A_CLUSTER.md", "SLOW_QUEUE.md", "COURSE_DAY.md"]
SITES = site_profiles.current_sites()   # no test cluster, no retired system


def text(name):
    return (NOTEBOOKS / name).read_text()


@pytest.mark.parametrize("name", PAGES + ["START_HERE.md"])
def test_every_link_of_a_page_reaches_a_file(name):
    links = [link for link in re.findall(r"\]\(([^)#\s]+)", text(name)) if "://" not in link]
    missing = [link for link in links if not (NOTEBOOKS / link).resolve().exists()]
    assert not missing, f"{name}: {missing}"


def test_start_here_links_the_participants_pages():
    start = text("START_HERE.md")
    for page in ["PRE_COURSE_MESSAGE.md", "LAB_ON_A_CLUSTER.md", "SLOW_QUEUE.md"]:
        assert f"]({page})" in start, page


def test_the_pages_name_the_readiness_row_that_warns_on_a_login_node():
    assert "where notebooks run" in readiness.CHECKS
    for page in ["PRE_COURSE_MESSAGE.md", "LAB_ON_A_CLUSTER.md", "COURSE_DAY.md"]:
        assert "`where notebooks run`" in text(page), page
    assert "make check" in text("PRE_COURSE_MESSAGE.md")


def _minutes(limit: str) -> int:
    return site_step.minutes(limit)


@pytest.mark.parametrize("site", SITES)
def test_the_test_partition_table_is_the_site_profiles(site):
    profile = site_profiles.load(site)
    row = next(ln for ln in text("SLOW_QUEUE.md").splitlines()
               if ln.lower().startswith(f"| {site} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == f"`{profile.partition_test}`", row
    nodes, limit = next((n, t) for part, n, t in profile.limits if part == profile.partition_test)
    assert _minutes(limit) == profile.test_max_minutes
    stated = cells[2]
    minutes = re.search(r"(\d+) (min|h)\b", stated)
    assert minutes and int(minutes.group(1)) * (60 if minutes.group(2) == "h" else 1) == profile.test_max_minutes, row
    assert re.search(rf"\b{nodes} nodes?\b", stated), row
    # the site step with --test moves the shell there, and refuses a time the partition does not take
    pairs = dict(site_step.exports(site, account="project_x", test=True))
    assert pairs["SBATCH_PARTITION"] == profile.partition_test
    with pytest.raises(site_profiles.ProfileError, match="takes at most"):
        site_step.exports(site, test=True, time=f"{profile.test_max_minutes + 1}")


def test_every_job_script_fits_every_test_partition_as_the_page_says():
    limits = [_minutes(m) for p in sorted((ROOT / "slurm").glob("*.slurm"))
              for m in re.findall(r"^#SBATCH --time=(\S+)", p.read_text(), re.M)]
    stated = re.search(r"Every job script asks for at most (\d+) minutes", text("SLOW_QUEUE.md"))
    assert limits and stated and max(limits) == int(stated.group(1)), (limits, stated)
    assert max(limits) <= min(site_profiles.load(s).test_max_minutes for s in SITES)


def test_the_cuts_name_sections_the_notebooks_have():
    rows = re.findall(r"^\s*\| (\d\d) \| ([^|]+) \| ([^|]+) \|$", text("COURSE_DAY.md"), re.M)
    assert len(rows) >= 10, rows
    for number, keep, cut in rows:
        path = next(NOTEBOOKS.glob(f"{number}_*.ipynb"))
        heads = {}
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                for m in re.finditer(r"^## (\d+)\. (.*)$", "".join(cell["source"]), re.M):
                    heads[int(m.group(1))] = m.group(2)
        named = set()
        for a, b in re.findall(r"\b(\d{1,2})(?:-(\d{1,2}))?\b", keep + " " + cut.split("the later")[0]):
            named |= set(range(int(a), int(b or a) + 1))
        assert named and named <= set(heads), (number, sorted(named - set(heads)))
        for ex in re.findall(r"\b(\d{1,2}) \(the exercises?\)|\b(\d{1,2}): the exercises?", keep):
            n = int(ex[0] or ex[1])
            assert "xercise" in heads[n], (number, n, heads[n])


def _core_lines(number: str) -> list[str]:
    """The sbatch lines printed in the core sections of a notebook (the course plan's reading)."""
    kind, out = course_plan.CORE, []
    for cell in json.loads(next(NOTEBOOKS.glob(f"{number}_*.ipynb")).read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and not course_plan.mark(cell).get("summary"):
            heads = course_plan.SECTION.findall(source)
            if heads:   # a cell's mark goes to its first heading; later headings are core
                kind = course_plan.mark(cell).get("section", course_plan.CORE) if len(heads) == 1 \
                    else course_plan.CORE
        for line in course_plan.sbatch_lines(source):
            if kind == course_plan.CORE and line not in out:
                out.append(line)
    return out


def _nodes(line: str) -> int:
    words = shlex.split(line)
    rest = words[words.index("sbatch") + 1:]
    for i, w in enumerate(rest):
        if w in ("-N", "--nodes"):
            return int(rest[i + 1])
        if w.startswith("--nodes="):
            return int(w.split("=", 1)[1])
    script = next((w for w in rest if w.startswith("slurm/")), None)
    found = script and re.search(r"^#SBATCH --nodes=(\d+)", (ROOT / script).read_text(), re.M)
    return int(found.group(1)) if found else 1


def test_the_reservation_table_counts_the_lines_each_day_submits():
    rows = {m[0]: tuple(map(int, m[1:])) for m in re.findall(
        r"^\| (one day|two days, day \d) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", text("COURSE_DAY.md"), re.M)}
    plans = {"one day": course_plan.COURSES["one day"][0], "two days, day 1": course_plan.COURSES["two days"][0],
             "two days, day 2": course_plan.COURSES["two days"][1]}
    assert set(rows) == set(plans), rows
    for name, numbers in plans.items():
        nodes = [_nodes(line) for n in numbers for line in _core_lines(n)]
        assert max(nodes) == 2                              # the n = 2 of the page's formula
        assert rows[name] == (len(nodes), nodes.count(1), nodes.count(2), sum(nodes)), (name, nodes)
    # the worked example: R = ceil(N n / (1 + W / t))
    page = text("COURSE_DAY.md")
    found = re.findall(r"t = (\d+) min[^R]*?R = (?:⌈[^⌉]*⌉ = )?(\d+)", page)
    assert len(found) == 2, found
    for t, r in found:
        assert int(r) == math.ceil(20 * 2 / (1 + 5 / int(t))), (t, r)
    assert re.search(r"R = ⌈40 / 3\.5⌉ = 12 nodes; with t = 5 min, R = 20", page)


def test_the_small_grant_plan_computes_its_waits_and_fits_the_rule():
    page = text("COURSE_DAY.md")
    waits = re.findall(r"\(⌈(\d+) / (\d+)⌉ − 1\) · (\d+) = (\d+) minutes", page)
    assert len(waits) == 2, waits
    for jobs_nodes, r, t, wait in waits:
        assert (math.ceil(int(jobs_nodes) / int(r)) - 1) * int(t) == int(wait), (jobs_nodes, r, t, wait)
    (room, r, _, alone), (groups, r2, _, grouped) = waits
    assert int(room) == 20 * 2 and int(groups) == 20 // 4 * 2 and r == r2 == "4"   # groups of four
    rule = re.search(r"a participant whose job has waited \*\*(\d+) minutes\*\*", text("SLOW_QUEUE.md"))
    assert int(alone) > int(rule.group(1)) >= int(grouped), (alone, grouped, rule)
    # the labs on Roihu: one GPU each, a node's GPUs to a node
    roihu = site_profiles.load("roihu")
    found = re.search(r"one GPU each, (\d+) to a node, ⌈N / \d+⌉ nodes all\s+day: (\d+) for 20", page)
    assert found and int(found.group(1)) == roihu.gpus_per_node
    assert int(found.group(2)) == math.ceil(20 / roihu.gpus_per_node)


def _plan_section(title: str) -> str:
    plan = (NOTEBOOKS / "COURSE_PLAN.md").read_text()
    return plan.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_what_course_day_says_of_the_plan_holds():
    ends = re.findall(r"^\| (\d\d):(\d\d) \| \*end\* \|", _plan_section("Two days"), re.M)
    assert len(ends) == 2 and all(int(h) * 60 + int(m) < 17 * 60 for h, m in ends), ends
    rows = [ln.split("|")[1:-1] for ln in _plan_section("Every section, timed").splitlines()
            if ln.startswith("| 06 |")]
    slots = {r[1].strip().split(".")[0]: r[2].strip() for r in rows if r[4].strip()}
    assert slots == {"8": "core", "10": "optional", "12": "optional"}, slots   # COURSE_DAY's "three exercises"
    assert "Notebook 06 has three\n   exercises (sections 8, 10 and 12), each with its exercise slot" in text("COURSE_DAY.md")


def test_roihus_site_step_in_the_message_takes_every_line_the_room_submits():
    """Roihu's gpumedium takes at most 4 GPUs a job: the message's Roihu line (--gpus-per-node 2)
    lets every core line of every plan through the site step's check, the default step refuses
    the two-node ones, and every participant's page names the option for Roihu."""
    page = text("PRE_COURSE_MESSAGE.md")
    line = re.search(r'`eval "\$\(python3 -m source_code\.launch\.site_profiles (--site roihu [^`]*?) '
                     r'--format exports\)"`', page)
    assert line, "the message spells out Roihu's second line"
    words = shlex.split(line.group(1))
    options = dict(zip(words[::2], words[1::2]))
    assert set(options) == {"--site", "--account", "--reservation", "--gpus-per-node"}, options
    # a reservation that names no partition resolves to the site's default partition, gpumedium
    roihu = site_profiles.load("roihu")
    assert dict(site_step.exports("roihu", "project_x"))["SBATCH_PARTITION"] == roihu.partition
    lines = {ln for plan in course_plan.COURSES.values() for day in plan for n in day for ln in _core_lines(n)}
    assert any(_nodes(ln) == 2 for ln in lines)
    for per, two_nodes_pass in ((int(options["--gpus-per-node"]), True), (None, False)):
        env = dict(site_step.exports("roihu", "project_x", gpus_per_node=per))
        for ln in sorted(lines):
            words = shlex.split(ln)
            refusal = site_step.check_submission(words[words.index("sbatch") + 1:], env, ROOT)
            assert (refusal is None) == (two_nodes_pass or _nodes(ln) == 1), (per, ln, refusal)
    assert "<Roihu: --gpus-per-node 2>" in page
    for name in ["SLOW_QUEUE.md", "LAB_ON_A_CLUSTER.md", "START_HERE.md", "COURSE_DAY.md"]:
        assert re.search(r"Roihu[^.]*`--gpus-per-node 2`", text(name)), name


def test_every_printed_site_step_tells_roihu_its_gpus_per_node():
    """A notebook's once-per-shell site step that asks for whole nodes would reset a Roihu
    participant's shell to 4 GPUs a node, which gpumedium refuses for the two-node lines: each
    such block says to add --gpus-per-node 2 there."""
    blocks = 0
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            for line in "".join(cell["source"]).splitlines():
                if "--format exports)" in line and "# once per shell" in line and "<site>" in line:
                    blocks += 1
                    assert "--gpus-per-node" in line, f"{path.name}: {line}"
    assert blocks >= 15
