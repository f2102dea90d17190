"""Ring all-reduce and parameter server simulated in NumPy: results, step structure, byte counts."""
import numpy as np
import pytest

from source_code import costmodel
from source_code.sync import ring_simulation as rs


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
@pytest.mark.parametrize("size", [1, 6, 10, 101])
def test_ring_result_is_the_plain_sum(n, size):
    rng = np.random.default_rng(n * 1000 + size)
    grads = [rng.standard_normal(size) for _ in range(n)]
    sim = rs.simulate_ring(grads)
    for got in sim.result:
        np.testing.assert_allclose(got, np.sum(grads, axis=0), rtol=0, atol=1e-12)
    # 1 start + (N-1) reduce-scatter + (N-1) all-gather steps, every worker sends once per step
    assert [s.phase for s in sim.steps].count("reduce-scatter") == n - 1
    assert [s.phase for s in sim.steps].count("all-gather") == n - 1
    assert all(len(s.transfers) == n for s in sim.steps[1:])


def test_after_reduce_scatter_each_worker_owns_one_complete_chunk():
    n = 4
    sim = rs.simulate_ring([np.full(8, 10.0 ** w) for w in range(n)])
    last_rs = [s for s in sim.steps if s.phase == "reduce-scatter"][-1]
    for w in range(n):
        complete = [c for c in range(n) if len(last_rs.contrib[w][c]) == n]
        assert complete == [(w + 1) % n]


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_counted_bytes_match_costmodel_traffic(n):
    nbytes = 4 * n * 64  # divisible by N: the formulas are exact
    row = rs.traffic([n], nbytes)[0]
    for algorithm in ("ring", "parameter_server"):
        formula = costmodel.traffic(algorithm, n, nbytes)
        del formula["messages"]
        assert row[algorithm] == formula, algorithm
    assert row["parameter_server"]["link_in"] == (n - 1) * nbytes  # the server's link, each way


def test_uneven_chunks_cost_at_most_one_element_per_step():
    n, elems = 4, 10  # chunks of 3, 3, 2, 2 elements
    sim = rs.simulate_ring([np.ones(elems) for _ in range(n)])
    formula = costmodel.traffic("ring", n, elems * 4)["rank_sent"]
    assert all(abs(b - formula) <= 2 * (n - 1) * 4 for b in sim.sent())


def test_parameter_server_round():
    grads = [np.array([1.0, 2.0]), np.array([3.0, 6.0])]  # rank 0 is the server and has a gradient too
    sim = rs.simulate_parameter_server(grads, np.zeros(2), lr=0.5)
    np.testing.assert_array_equal(sim.total, [4.0, 8.0])
    np.testing.assert_array_equal(sim.sent(), [8, 8])  # two float32 (8 bytes) each way
    for w in sim.result:  # w = 0 - 0.5 * mean gradient
        np.testing.assert_array_equal(w, [-1.0, -2.0])
    assert [s.phase for s in sim.steps] == ["start", "push", "aggregate", "update", "pull"]


def test_drawings_have_one_panel_per_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_EXPORT_FIGURES", "1")  # files are written only when exporting
    import matplotlib
    matplotlib.use("Agg")
    for n in (3, 4):
        ps = rs.draw_parameter_server(rs.simulate_parameter_server([np.ones(2)] * n, np.zeros(2)))
        assert len(ps.axes) == 4
        sim = rs.simulate_ring([np.arange(5.0)] * n)
        fig = rs.draw_ring(sim, tmp_path / f"ring{n}.png")
        assert len(fig.axes) == 2 * n - 1
        assert (tmp_path / f"ring{n}.png").stat().st_size > 0
