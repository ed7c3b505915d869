"""`rlvr jobs report`'s HTML (clients/report.py): self-contained, and checked in a real headless
chromium: every chart decodes (naturalWidth > 0) and the rendered page is not blank.

Chromium comes from `make chromium` (Debian: `apt-get install -y chromium`, as root; `make test`
runs it). Without it these browser tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_jobs_view import RISING, make_metrics

from rlvr.clients.report import write_report
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

CHARTS = ["reward_accuracy", "loss", "kl_entropy", "completion_length"]  # the spec's pairs
INSTALL = "install it with `make chromium` (as root on Debian: apt-get install -y chromium)"


def _chromium() -> str:
    for name in (os.environ.get("RLVR_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    message = f"headless chromium is not installed: {INSTALL}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def _run_chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={profile}", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}: {out.stderr[-2000:]}"
    return out


def _job() -> C.Job:
    job = C.Job(id="job-rising", status=C.JOB_STATUS_COMPLETED, current_step=12, total_steps=12)
    job.spec.name = "math-pairs <grpo> & kl"
    job.spec.base_model = "rlvr-tiny"
    s = job.summary
    s.method, s.model, s.reward, s.backend = "RLVR (GRPO)", "rlvr-tiny", "Math Pairs (synthetic)", "vLLM (colocate)"
    s.group_size, s.max_completion, s.lora_rank, s.learn_rate, s.max_steps = 8, 256, 8, 1e-6, 12
    job.warnings.append("advanced.kl_beta 0.04 slows each step")
    return job


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    metrics = make_metrics(RISING, kl=True, job_id="job-rising")
    assert metrics.accuracy_trend.direction == S.TREND_DIRECTION_RISING
    return write_report(metrics, _job(), tmp_path_factory.mktemp("report") / "out")


def test_report_is_self_contained(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert report.name == "report.html"
    # No network and no script: every src/href is a data URI, nothing is fetched.
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert not re.search(r"(src|href)\s*=\s*[\"'](?!data:)", page)
    assert "http://" not in page and "https://" not in page and "url(" not in page
    # The same content as the terminal view, escaped.
    for text in ("Accuracy Trend", "Reward Trend", "↑", "rising", "Best Accuracy", "Final Loss",
                 "math-pairs &lt;grpo&gt; &amp; kl", "Math Pairs (synthetic)", "advanced.kl_beta 0.04"):
        assert text in page, text
    # Each chart is a PNG next to the page and the same bytes inline.
    for key in CHARTS:
        png = (report.parent / f"{key}.png").read_bytes()
        assert png.startswith(b"\x89PNG")
        assert f'id="chart-{key}"' in page
        assert base64.b64encode(png).decode() in page
    assert not (report.parent / "entropy.png").exists() and not (report.parent / "reward.png").exists()
    assert page.index("chart-reward_accuracy") < page.index("chart-loss") < page.index("chart-kl_entropy")
    assert "Reward &amp; accuracy: steps 1–12; reward last" in page  # one caption names both series


def test_no_steps_report_says_so(tmp_path: Path) -> None:
    path = write_report(make_metrics([]), None, tmp_path)
    page = path.read_text(encoding="utf-8")
    assert "no training step recorded yet: the job is queued" in page and "<img" not in page
    assert list(tmp_path.glob("*.png")) == []


PROBE = """<img id="broken" alt="" src="data:image/png;base64,AAAA">
<script>
window.addEventListener('load', function () {
  var out = Array.prototype.map.call(document.images, function (img) {
    return {id: img.id, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight};
  });
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def test_charts_decode_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    browser = _chromium()
    # A copy of the page with a probe that writes each image's decoded size into the DOM, and a
    # deliberately broken image to show the probe can tell.
    probe = report.parent / "probe.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    out = _run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom",
                        probe.as_uri())
    match = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert match, f"the probe did not run; DOM: {out.stdout[:500]}"
    images = {img["id"]: img for img in json.loads(match.group(1))}
    assert images.pop("broken")["width"] == 0
    assert sorted(images) == sorted(f"chart-{key}" for key in CHARTS)
    for key in CHARTS:
        width, height = Image.open(report.parent / f"{key}.png").size
        img = images[f"chart-{key}"]
        assert img["complete"] and (img["width"], img["height"]) == (width, height), img


def test_screenshot_is_not_blank(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    browser = _chromium()
    shot = tmp_path / "report.png"
    _run_chromium(browser, tmp_path / "profile", "--window-size=1200,1800", f"--screenshot={shot}",
                  report.as_uri())
    image = Image.open(shot).convert("RGB")
    if os.environ.get("RLVR_KEEP_SCREENSHOT"):  # to look at it: RLVR_KEEP_SCREENSHOT=/tmp/report.png
        image.save(os.environ["RLVR_KEEP_SCREENSHOT"])
    assert image.size == (1200, 1800)
    pixels = np.asarray(image).reshape(-1, 3).astype(int)
    colours = len(np.unique(pixels, axis=0))
    assert colours > 200, f"{colours} colours: a blank page?"
    background = np.all(pixels == pixels[0], axis=1).mean()
    assert background < 0.9, f"{background:.0%} of the page is its background colour"

    def near(rgb: tuple[int, int, int]) -> int:
        return int((np.abs(pixels - np.array(rgb)).sum(axis=1) < 40).sum())

    # The chart lines were painted: pixels near the reward blue and the accuracy green.
    assert near((0x25, 0x63, 0xEB)) > 200 and near((0x16, 0xA3, 0x4A)) > 200
