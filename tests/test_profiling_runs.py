"""The profiling entry points on 2 real processes: what notebook 15 does not run.

Notebook 15 (run by nbval in the same suite) launches profile_ddp.py (its cells assert the
communication and computation kinds, aten::convolution_backward as computation, both ranks'
totals, the trace files written and holding the active steps only), throughput.py under
torchrun (one summary line from rank 0, progress lines without a bar, samples/s and the data
wait's share) and through the fork server (strong and weak scaling, the loader's workers), and
the hang drill with and without TORCH_DISTRIBUTED_DEBUG=DETAIL (both ranks stop within the
timeout with the rank named, either one's report first; the flight recorders' first mismatch;
DETAIL's fingerprints with the tensor's shape): they are not launched a second time here.
"""
import pytest

from source_code.errors import run_main
from source_code.profiling import hang
from source_code.training.loop import parse_summary


@pytest.mark.parity
def test_fixed_loop_runs_through(torchrun, tmp_path):
    out = torchrun("source_code.profiling.hang", "--fixed", "--timeout", 3, "--trace-dir", tmp_path,
                   timeout=90).stdout
    s = parse_summary(out)
    assert s["hang_detected"] == 0 and "rank 0 made 6 all-reduces" in out, out


def test_bad_flag_is_one_line(capsys):
    # run_main(main), what `python -m` runs: refused while parsing, before main pins the CPU
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: hang.main(["--timeout", "0"]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.strip().startswith("error: argument --timeout: 0 is not"), err
