"""throughput.png: no label over the title, no point under the legend, nothing clipped, failures as markers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attune.report.plots import throughput_figure, throughput_plot


@pytest.fixture(scope="module")
def result(recorded_run: Path) -> dict:
    return json.loads((recorded_run / "result.json").read_text())


def _layout(result: dict):
    fig = throughput_figure(result)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return fig, renderer


def test_no_text_overlaps_the_title_and_nothing_is_clipped(result: dict):
    import matplotlib.pyplot as plt

    fig, renderer = _layout(result)
    title = fig._suptitle.get_window_extent(renderer)
    fig_box = fig.bbox
    texts = [t for ax in fig.axes for t in ax.texts] + [t for t in fig.texts if t is not fig._suptitle]
    assert texts, "points are labelled"
    for t in texts:
        box = t.get_window_extent(renderer)
        assert not box.overlaps(title), f"{t.get_text()!r} overlaps the title"
        assert box.x0 >= fig_box.x0 - 1 and box.x1 <= fig_box.x1 + 1, f"{t.get_text()!r} is clipped"
        assert box.y0 >= fig_box.y0 - 1 and box.y1 <= fig_box.y1 + 1, f"{t.get_text()!r} is clipped"
    plt.close(fig)


def test_the_legend_hides_no_point(result: dict):
    import matplotlib.pyplot as plt

    fig, renderer = _layout(result)
    legend = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        for coll in ax.collections:
            for xy in coll.get_offsets():
                px, py = ax.transData.transform(xy)
                assert not legend.contains(px, py), "a point lies under the legend"
        assert ax.get_legend() is None  # one figure legend, below the axes
    plt.close(fig)


def test_failed_trials_are_markers_in_their_own_lane(result: dict):
    import matplotlib.pyplot as plt

    fig, _ = _layout(result)
    main = max(fig.axes, key=lambda a: a.get_position().height)
    lo, hi = main.get_ylim()
    measured = [t["throughput"] for t in result["trials"] if t["throughput"]]
    assert lo > 0.5 * min(measured) and hi >= max(measured)  # failures do not pull the axis down to zero
    lanes = [a for a in fig.axes if a is not main]
    labels = {t.get_text() for a in lanes for t in a.get_yticklabels()}
    assert "failed" in labels and any("refused" in x for x in labels)
    failed_ids = {str(t["id"]) for t in result["trials"] if t["outcome"] in ("oom", "crashed", "timed_out")}
    lane_ids = {t.get_text() for a in lanes for t in a.texts}
    assert failed_ids <= lane_ids
    plt.close(fig)


def test_png_is_written(result: dict, tmp_path: Path):
    path = throughput_plot(result, tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
