"""The report's charts: each writes a valid PNG and draws what its caption in report.md promises."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import assert_valid_png

from lightning_tune_data.report.plots import plot_efficiency, plot_lengths, plot_losses, plot_mix, plot_truncation



@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list:
    """The figures the plots close once saved, kept to look at what they drew."""
    figures: list = []
    close = plt.close

    def keep(fig=None) -> None:  # noqa: ANN001 - matplotlib Figure
        figures.append(fig)
        close(fig)

    monkeypatch.setattr(plt, "close", keep)
    return figures


def legend_labels(ax) -> list[str]:  # noqa: ANN001 - matplotlib Axes
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_mix_draws_documents_and_tokens_per_source_against_the_target(tmp_path: Path, drawn: list) -> None:
    path = plot_mix(tmp_path / "mix.png", [1, 2, 3], {"a": [0.5, 0.6, 0.7], "b": [0.5, 0.4, 0.3]},
                    {"a": [0.2, 0.3, 0.3]}, {"a": 0.7, "b": 0.3}, "tokens")
    assert path == tmp_path / "mix.png"
    assert_valid_png(path)
    [ax] = drawn[0].axes
    assert legend_labels(ax) == ["a: documents", "a: tokens", "b: documents"]
    assert ax.get_title() == "Realised vs target mix (dotted: target weights as shares of tokens)"
    assert ax.get_xlabel() == "batches drawn"
    targets = sorted(line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == ":")
    assert targets == [0.3, 0.7]
    plot_mix(tmp_path / "steps.png", [10], {"a": [1.0]}, {}, {}, None, xlabel="step")
    assert drawn[1].axes[0].get_title() == "Realised vs target mix (dotted: target weights)"


def test_lengths_draw_one_histogram_per_source_with_lengths(tmp_path: Path, drawn: list) -> None:
    lengths = {"short": np.array([3, 4, 5, 90]), "none": np.zeros(0, dtype=np.int64), "long": np.array([60, 80])}
    assert_valid_png(plot_lengths(tmp_path / "lengths.png", lengths, max_seq_len=64))
    titles = [ax.get_title() for ax in drawn[0].axes]
    assert titles == ["short: 4 documents, 1 (25.0%) longer than max_seq_len",
                      "long: 2 documents, 1 (50.0%) longer than max_seq_len"]
    assert_valid_png(plot_lengths(tmp_path / "streaming.png", {"s": np.zeros(0, dtype=np.int64)}, max_seq_len=64))
    assert drawn[1].axes[0].texts[0].get_text() == "no cached lengths (streaming sources)"


def test_efficiency_marks_the_mean_share_of_real_tokens(tmp_path: Path, drawn: list) -> None:
    assert_valid_png(plot_efficiency(tmp_path / "efficiency.png", [1, 2, 3], [0.5, 0.75, 1.0], "Real tokens"))
    [ax] = drawn[0].axes
    assert ax.get_title() == "Real tokens" and legend_labels(ax) == ["mean 75.0%"]
    plot_efficiency(tmp_path / "empty.png", [], [], "nothing drawn")
    assert drawn[1].axes[0].get_legend() is None


def test_truncation_draws_a_bar_per_source_and_series(tmp_path: Path, drawn: list) -> None:
    sources = ["a", "b"]
    assert_valid_png(plot_truncation(tmp_path / "truncation.png", sources, {"a": 0.5, "b": 0.0},
                                     {"a": 0.25, "b": 0.0}, {"a": 0.0, "b": 0.1}))
    [ax] = drawn[0].axes
    assert legend_labels(ax) == ["longer than max_seq_len (cache)", "truncated (drawn)", "dropped (drawn)"]
    assert [round(bar.get_height(), 6) for bar in ax.patches] == [50.0, 0.0, 25.0, 0.0, 0.0, 10.0]
    plot_truncation(tmp_path / "no_cache.png", sources, None, {"a": 0.25}, {})
    assert legend_labels(drawn[1].axes[0]) == ["truncated (drawn)", "dropped (drawn)"]


def test_losses_draw_sources_and_the_overall_loss_apart(tmp_path: Path, drawn: list) -> None:
    steps = {"a": [1, 2], "b": [1, 2], "interleaved": [1, 2]}
    losses = {"a": [2.0, 1.5], "b": [3.0, 2.5], "interleaved": [2.5, 2.0]}
    assert_valid_png(plot_losses(tmp_path / "loss.png", steps, losses, sources=["a", "b"]))
    assert legend_labels(drawn[0].axes[0]) == ["a", "b", "interleaved (overall)"]
    plot_losses(tmp_path / "all.png", steps, losses)
    assert legend_labels(drawn[1].axes[0]) == ["a", "b", "interleaved"]
    assert matplotlib.get_backend().lower() == "agg"


def test_online_mixing_draws_each_sources_weight_and_loss_per_update(tmp_path: Path, drawn: list) -> None:
    from lightning_tune_data.report.plots import plot_online_mixing

    path = plot_online_mixing(tmp_path / "online.png", [9, 19, 29], {"a": [0.5, 0.4, 0.3], "b": [0.5, 0.6, 0.7]},
                              {"a": [1.0, 1.1, 1.2], "b": [4.0, 3.9, 3.8]})
    assert_valid_png(path)
    top, bottom = drawn[0].axes
    assert legend_labels(top) == ["a", "b"]
    assert [list(line.get_ydata()) for line in top.lines] == [[0.5, 0.4, 0.3], [0.5, 0.6, 0.7]]
    assert [list(line.get_ydata()) for line in bottom.lines] == [[1.0, 1.1, 1.2], [4.0, 3.9, 3.8]]
