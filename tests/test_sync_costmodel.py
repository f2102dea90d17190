"""The one alpha-beta model (beta = bandwidth in bytes/s) and the one traffic count."""
import numpy as np
import pytest

from source_code import costmodel
from source_code.basics import pingpong
from source_code.sync import allreduce_benchmark


def test_fit_recovers_a_known_alpha_beta_with_noise():
    sizes = np.array([2**k for k in range(3, 27, 2)], dtype=float)
    alpha, beta = 50e-6, 2e9  # 50 us, 2 GB/s
    times = (alpha + sizes / beta) * (1 + 0.01 * np.cos(np.arange(len(sizes))))  # 1% wiggle
    a, b = costmodel.fit_alpha_beta(sizes, times)
    assert a == pytest.approx(alpha, rel=0.05) and b == pytest.approx(beta, rel=0.05)
    assert costmodel.crossover_bytes(a, b) == pytest.approx(alpha * beta, rel=0.1)


def test_one_fit_for_pingpong_and_benchmark():
    assert pingpong.fit_alpha_beta is costmodel.fit_alpha_beta
    assert allreduce_benchmark.fit_alpha_beta is costmodel.fit_alpha_beta


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_traffic_formulas(n):
    m = 1000.0
    ring, naive, ps = (costmodel.traffic(a, n, m) for a in costmodel.ALGORITHMS)
    assert ring["link_in"] == ring["link_out"] == ring["rank_sent"] == pytest.approx(2 * (n - 1) / n * m)
    assert naive["link_out"] == (n - 1) * m and naive["messages"] == n - 1
    assert ps["link_in"] == ps["link_out"] == (n - 1) * m and ps["rank_sent"] == m
    assert ring["messages"] == 2 * (n - 1) and ps["messages"] == 2
    assert costmodel.busbw_factor(n) == pytest.approx(2 * (n - 1) / n)


def test_predicted_time_and_crossover():
    alpha, beta, n = 1e-3, 1e9, 4
    assert costmodel.predicted_time("ring", n, 0, alpha, beta) == pytest.approx(6e-3)
    assert costmodel.predicted_time("parameter_server", n, 1e6, alpha, beta) == pytest.approx(2e-3 + 6e-3)
    # two lines: 1 ms + M / 1 GB/s and 5 ms + M / 2 GB/s meet at M = 8 MB
    assert costmodel.equal_time_bytes((5e-3, 2e9), (1e-3, 1e9)) == pytest.approx(8e6)
    assert costmodel.equal_time_bytes((1e-3, 2e9), (5e-3, 1e9)) is None
    with pytest.raises(ValueError, match="algorithm must be one of"):
        costmodel.traffic("tree", 4, 1.0)
