"""Figures reach images/ only when exported on purpose (make figures), never from a test run."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from source_code import figures  # noqa: E402


def test_export_writes_only_when_asked(tmp_path, monkeypatch):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    monkeypatch.delenv("WORKSHOP_EXPORT_FIGURES", raising=False)
    assert figures.export(fig, tmp_path / "a.png") is None and not (tmp_path / "a.png").exists()
    monkeypatch.setenv("WORKSHOP_EXPORT_FIGURES", "1")
    assert figures.export(fig, tmp_path / "a.png") == tmp_path / "a.png"
    assert (tmp_path / "a.png").stat().st_size > 1000
    assert figures.IMAGES.name == "images" and (figures.IMAGES.parent / "README.md").exists()
    plt.close(fig)
