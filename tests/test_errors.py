"""run_main's one line per job: rank 0 prints it whatever order the ranks end in."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import os, time
    from pathlib import Path
    from source_code.errors import LaunchError, run_main

    def main():
        marker = Path(os.environ["MARKER"])
        if os.environ["RANK"] != "0":
            marker.write_text("rank 1 is stopping")     # rank 1 ends first ...
        else:
            while not marker.exists():                  # ... rank 0 raises only after it
                time.sleep(0.01)
        raise LaunchError("error: the same mistake on every rank; the fix is named here")

    if __name__ == "__main__":
        run_main(main)
""")


def test_the_line_comes_out_when_another_rank_ends_first(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", str(script)], cwd=ROOT, capture_output=True, text=True,
                         timeout=180, env={**__import__("os").environ, "MARKER": str(tmp_path / "m"),
                                           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert out.count("error: the same mistake on every rank") == 1, out[-3000:]
    assert "Traceback" not in out.split("error: the same mistake")[0], out[-3000:]
