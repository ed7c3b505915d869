"""`rlvr loops report`'s HTML (clients/loop_report.py): self-contained, the same content as the
terminal view, and checked in a real headless chromium exactly as tests/test_report.py checks the
job report (its helpers): the chart decodes (natural size > 0, equal to the PNG's), and the
rendered page is not blank, with the BEST bar's green and the other bars' blue painted.

Chromium comes from `make chromium`; without it the browser tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from test_loops_view import failed_loop, make_loop
from test_report import PROBE, _chromium, _run_chromium

from rlvr.clients import loop_report
from rlvr.clients.loop_report import write_loop_report
from rlvr.clients.views.loops import duration
from rlvr.v1 import scheduler_pb2 as S


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    loop = make_loop(name="math-pairs <to> 70% & more")
    loop.warnings.append("the rounds train on GSM8K accuracy but are scored on rlvr-math-pairs-heldout")
    return write_loop_report(loop, tmp_path_factory.mktemp("loop-report") / "out")


def test_report_is_self_contained_and_says_what_the_view_says(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert report.name == "report.html"
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert not re.search(r"(src|href)\s*=\s*[\"'](?!data:)", page)
    assert "http://" not in page and "https://" not in page and "url(" not in page
    for text in ("math-pairs &lt;to&gt; 70% &amp; more", "Target reached", "target 70% reached in round 7 (70.0%)",
                 "70.0%", "+36.0 pts over R1", "7 of 8", "4h 23m", "training 3h 50m · benchmarking 25m", "30.2%",
                 "rlvr-math-pairs-heldout (accuracy)", "Training Summary (each round)", "Math Pairs (synthetic)",
                 "Give Up After", "the rounds train on GSM8K accuracy"):
        assert text in page, text
    # one row per round with its job id, duration, score and delta arrow; BEST on R7 only
    rows = re.findall(r'<tr class="(best)?" id="round-(\d+)">(.*?)</tr>', page)
    assert [int(index) for _, index, _ in rows] == list(range(1, 8))
    for best, index, cells in rows:
        assert f"job{int(index):03d}abcdef" in cells and f">{duration(2200 + 37 * int(index))}<" in cells
        assert ("BEST" in cells) == (index == "7") == (best == "best")
    cells = {index: cells for _, index, cells in rows}
    assert "↑</span> +7.5" in cells["2"] and "↓</span> -1.5" in cells["3"] and "arrow" not in cells["1"]
    assert "no real gain (needs &gt; 1.5 pts)" in cells["3"]
    # the chart: a PNG beside the page and the same bytes inline
    png = (report.parent / "scores.png").read_bytes()
    assert png.startswith(b"\x89PNG") and 'id="chart-scores"' in page
    assert base64.b64encode(png).decode() in page
    assert page.count("data:image/png;base64,") == 1


def test_failed_loop_report_shows_the_errors(tmp_path: Path) -> None:
    page = write_loop_report(failed_loop(), tmp_path).read_text(encoding="utf-8")
    assert 'class="badge FAILED">Failed<' in page and "error: round 4: trainer worker" in page
    assert "failed at step 30/100" in page and page.count("illegal memory access") == 2


def test_nothing_scored_has_no_chart(tmp_path: Path) -> None:
    loop = make_loop([], status=S.LOOP_STATUS_QUEUED, baseline=None, message="")
    page = write_loop_report(loop, tmp_path).read_text(encoding="utf-8")
    assert "Nothing scored yet." in page and "No round started yet." in page and "<img" not in page
    assert list(tmp_path.glob("*.png")) == []


def test_chart_png_has_the_bars_and_lines() -> None:
    from PIL import Image

    image = Image.open(io.BytesIO(loop_report.chart_png(make_loop()))).convert("RGB")
    pixels = np.asarray(image).reshape(-1, 3).astype(int)

    def near(hex_color: str) -> int:
        rgb = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(pixels - rgb).sum(axis=1) < 30).sum())

    assert near(loop_report.BEST_COLOR) > 2000 and near(loop_report.BAR_COLOR) > 5000
    assert near(loop_report.TARGET_COLOR) > 300 and near(loop_report.BASELINE_COLOR) > 100


def test_chart_decodes_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    browser = _chromium()
    probe = report.parent / "probe.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    out = _run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    match = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert match, f"the probe did not run; DOM: {out.stdout[:500]}"
    images = {img["id"]: img for img in json.loads(match.group(1))}
    assert images.pop("broken")["width"] == 0
    assert sorted(images) == ["chart-scores"]
    width, height = Image.open(report.parent / "scores.png").size
    img = images["chart-scores"]
    assert img["complete"] and img["width"] > 0 and (img["width"], img["height"]) == (width, height), img


def test_screenshot_is_not_blank(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    browser = _chromium()
    shot = tmp_path / "report.png"
    _run_chromium(browser, tmp_path / "profile", "--window-size=1200,1800", f"--screenshot={shot}", report.as_uri())
    image = Image.open(shot).convert("RGB")
    if os.environ.get("RLVR_KEEP_SCREENSHOT"):  # to look at it: RLVR_KEEP_SCREENSHOT=/tmp/loop-report.png
        image.save(os.environ["RLVR_KEEP_SCREENSHOT"])
    assert image.size == (1200, 1800)
    pixels = np.asarray(image).reshape(-1, 3).astype(int)
    colours = len(np.unique(pixels, axis=0))
    assert colours > 200, f"{colours} colours: a blank page?"
    background = np.all(pixels == pixels[0], axis=1).mean()
    assert background < 0.9, f"{background:.0%} of the page is its background colour"

    def near(rgb: tuple[int, int, int]) -> int:
        return int((np.abs(pixels - np.array(rgb)).sum(axis=1) < 40).sum())

    # the BEST bar's green and the other bars' light blue were painted
    assert near((0x16, 0xA3, 0x4A)) > 2000 and near((0x93, 0xC5, 0xFD)) > 5000
