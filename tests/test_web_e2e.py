"""The web console in a real headless chromium (Playwright driving the system chromium) on the real
stack: embedded NATS, SQLite, the five services and the console as child processes, the console
started by `rlvr.clients.stack.Stack` exactly as `rlvr up` starts it.

What a person does, in order: fill the New Training form with an invalid value (the server's error
appears next to its field) and the batch size the spec rounds up, start the job and watch its page
update live until it completes, download the adapter, open the history export, merge the model;
start an automated loop from the same form and watch its page to the end; open a round's evaluation
and filter the wrong answers; then every page again at 390 px with and without JavaScript. No page
may log a console error, screenshots must not be blank, and the basic accessibility rules are
checked on every page (labels, one h1, alt texts, text contrast).

`RLVR_WRITE_SCREENSHOTS=1` also writes docs/console-job.png and docs/console-loop.png (docs/web-console.md's).
Chromium comes from `make chromium`; without it (or without Playwright) these tests skip locally
and fail under CI=true.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_stack import SMALL_MODEL as MODEL  # the shared stack's model

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
INSTALL = "install it with `make chromium` (as root on Debian: apt-get install -y chromium)"
STEPS = 3


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def _chromium() -> str:
    for name in (os.environ.get("RLVR_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    _missing(f"headless chromium is not installed: {INSTALL}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: `make install` (pip install -e '.[cpu,dev]')")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def stack(small_stack, browser: object) -> tuple[object, str]:  # noqa: ANN001 (tests/fixtures_stack.py)
    shared = small_stack.get()
    return shared.client, shared.web_url


class Pages:
    """Browser pages that remember every console error and uncaught exception they saw."""

    def __init__(self, browser: object, base: str) -> None:
        self.browser, self.base = browser, base
        self.errors: list[str] = []
        self.contexts: list[object] = []

    def new(self, width: int = 1280, javascript: bool = True):  # noqa: ANN201 (a playwright Page)
        context = self.browser.new_context(viewport={"width": width, "height": 900}, base_url=self.base,  # type: ignore[attr-defined]
                                           java_script_enabled=javascript, accept_downloads=True)
        self.contexts.append(context)
        page = context.new_page()
        page.on("console", lambda m: self.errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"{page.url}: {e}"))
        page.set_default_timeout(30_000)
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture
def pages(browser: object, stack: tuple[object, str]) -> Iterator[Pages]:
    opened = Pages(browser, stack[1])
    yield opened
    opened.close()
    assert not opened.errors, "console errors:\n" + "\n".join(opened.errors)


STATE: dict[str, str] = {}


# ---------------------------------------------------------------- checks shared by the tests

A11Y = """() => {
  const problems = [];
  const h1 = document.querySelectorAll("h1").length;
  if (h1 !== 1) problems.push(`${h1} h1 elements`);
  for (const el of document.querySelectorAll("input:not([type=hidden]):not([aria-hidden=true]), select, textarea")) {
    if (!el.labels?.length && !el.getAttribute("aria-label")) problems.push(`no label: ${el.outerHTML.slice(0, 80)}`);
  }
  for (const img of document.querySelectorAll("img")) {
    if (!img.getAttribute("alt")) problems.push(`no alt: ${img.id}`);
  }
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
                                    .reduce((a, v, i) => a + v * [0.2126, 0.7152, 0.0722][i], 0);
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  for (const el of document.querySelectorAll("body *")) {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    const style = getComputedStyle(el);
    if (!own || style.visibility === "hidden" || el.closest("[hidden], .visually-hidden, svg, [aria-disabled=true], option")) continue;
    const rect = el.getBoundingClientRect();
    if (!rect.width || !rect.height) continue;
    const [l1, l2] = [lum(rgb(style.color).slice(0, 3)), lum(background(el))].sort((a, b) => b - a);
    const ratio = (l1 + 0.05) / (l2 + 0.05);
    const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
    const needed = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    if (ratio < needed) problems.push(`contrast ${ratio.toFixed(2)} < ${needed}: ${el.tagName} "${el.textContent.trim().slice(0, 40)}"`);
  }
  return problems;
}"""


def check_page(page, width: int = 1280) -> None:  # noqa: ANN001 (a playwright Page)
    """Accessible as far as a script can tell, and no wider than the viewport."""
    assert page.evaluate(A11Y) == [], page.url
    assert page.evaluate("document.documentElement.scrollWidth") <= width, f"{page.url} scrolls sideways at {width}px"


def screenshot(page, name: str, docs: str | None = None) -> bytes:  # noqa: ANN001
    """A full-page screenshot that is not blank; with RLVR_WRITE_SCREENSHOTS=1, also docs/<docs>."""
    from PIL import Image, ImageStat

    png = page.screenshot(full_page=True)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    spread = ImageStat.Stat(image).stddev
    assert max(spread) > 20 and len(image.getcolors(1 << 20) or []) > 50, f"{name}: the screenshot looks blank"
    if docs and os.environ.get("RLVR_WRITE_SCREENSHOTS") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        height = min(image.height, 1400)
        (ROOT / "docs" / docs).write_bytes(page.screenshot(full_page=True,
                                                            clip={"x": 0, "y": 0, "width": 1280, "height": height}))
    return png


def fill_job(page, steps: int, rank: str = "4") -> None:  # noqa: ANN001
    """The tiny job's settings on the New Training form (group 8 and batch 4 stay: the spec's case)."""
    page.fill("#f-base_model", MODEL)
    page.fill("#f-reward-synthetic_prompts", "64")
    page.fill("#f-grpo-max_completion_tokens", "64")
    page.fill("#f-grpo-lora_rank", rank)
    page.fill("#f-grpo-lora_alpha", "128")
    page.click("button.chip[data-set='f-grpo-learning_rate'][data-value='1e-5']")
    page.fill("#f-grpo-max_steps", str(steps))
    page.click("#advanced > summary")
    page.select_option("#f-advanced-generation_backend", label="Transformers (in-process)")


# ---------------------------------------------------------------- the tests, in the order a person goes


def test_new_training_form_validation_rounding_and_a_live_job(pages: Pages) -> None:
    page = pages.new()
    page.goto("/train")
    assert page.is_visible("input.slider[data-for='f-grpo-group_size']")  # the script enhanced the form
    check_page(page)
    # The spec's case: Batch Size 4 against Group size 8 shows the warning (the server's dry run).
    assert page.input_value("#f-grpo-group_size") == "8" and page.input_value("#f-grpo-batch_size") == "4"
    assert "rounded up to 8" in page.inner_text("#f-grpo-batch_size-msg")
    page.fill("#f-name", "web e2e job")
    fill_job(page, STEPS, rank="99")
    assert "99 is out of range" in page.inner_text("#f-grpo-lora_rank-msg")  # the client-side hint, at once
    with page.expect_navigation():
        page.click("#start-training")
    # The server's answer, next to the field; nothing started; what was typed is kept.
    assert page.inner_text("#f-grpo-lora_rank-msg") == "grpo.lora_rank: 99 is out of range; allowed: 4-64 (default 8)"
    assert page.get_attribute("#f-grpo-lora_rank", "aria-invalid") == "true"
    assert page.input_value("#f-base_model") == MODEL and page.input_value("#f-grpo-max_steps") == str(STEPS)
    assert page.is_visible("#error-summary")
    page.fill("#f-grpo-lora_rank", "4")
    page.dispatch_event("#f-grpo-lora_rank", "change")
    # The sidebar is the server's dry run of the form, asked again on a change.
    page.wait_for_function("document.getElementById('train-summary').innerText.includes('Transformers')")
    assert page.inner_text("#f-grpo-lora_rank-msg") == ""
    summary = page.inner_text("#train-summary")
    assert "Transformers (in-process)" in summary and re.search(r"Batch Size\s+8", summary)
    page.click("#start-training")
    page.wait_for_url(re.compile(r"/jobs/[^/]+$"))
    STATE["job"] = page.url.rsplit("/", 1)[1]
    page.evaluate("window.__sameDocument = true")  # gone if the page reloaded instead of updating
    assert page.get_attribute("main", "data-live")
    page.wait_for_function("document.body.dataset.live === 'done'", timeout=240_000)
    assert page.evaluate("window.__sameDocument === true") and int(page.evaluate("document.body.dataset.updates")) >= 1
    assert page.inner_text("#job-status .badge") == "completed"
    assert page.inner_text("[data-tile='Steps']") == str(STEPS)
    for key in ("reward_accuracy", "loss"):  # the spec's pairs: reward and accuracy on one chart
        assert page.evaluate(f"document.getElementById('chart-{key}').naturalWidth") > 0
    assert page.evaluate("document.getElementById('chart-reward')") is None
    assert "Accuracy Trend" in page.inner_text("#rl-metrics") and "Reward Trend" in page.inner_text("#rl-metrics")
    assert re.search(r"Batch Size\s+8", page.inner_text("aside")) and "grpo.batch_size 4" in page.inner_text("aside")
    # the Completions card: the last step's samples (GetJobSamples off the stream), newest first
    assert page.locator("#completions .sample-step").first.inner_text().strip() == f"Step {STEPS}"
    assert page.locator("#completions details.sample").count() >= 1
    check_page(page)
    screenshot(page, "job page", "console-job.png")


def test_an_sft_job_from_the_training_method_selector(pages: Pages) -> None:
    """Supervised (SFT) chosen on the New Training form: its card shows and the Reward and GRPO cards
    hide, the sidebar is SFT's Training Summary, and the job's page is its SFT Metrics card."""
    page = pages.new()
    page.goto("/train")
    assert page.is_visible("#f-reward-synthetic_prompts") and not page.is_visible("#sft-card")
    page.check("#method-2")
    assert page.is_visible("#sft-card") and not page.is_visible("#grpo-h") and not page.is_visible("#reward-h")
    assert page.input_value("#f-sft-learning_rate") == "0.0002" and page.is_checked("#f-sft-completion_only_loss")
    page.fill("#f-name", "web sft job")
    page.fill("#f-base_model", MODEL)
    page.fill("#f-sft-dataset", "examples/sft/math-pairs")
    page.click("button.chip[data-set='f-sft-learning_rate'][data-value='5e-4']")  # the SFT range's presets
    assert page.input_value("#f-sft-learning_rate") == "5e-4"
    page.fill("#f-sft-max_steps", "4")
    page.fill("#f-sft-max_seq_length", "128")
    page.dispatch_event("#f-sft-max_seq_length", "change")
    # the dataset: the message before the fields reach the summary ("required for a Supervised (SFT) job")
    # names the method too
    page.wait_for_function("document.getElementById('train-summary').innerText.includes('math-pairs')")
    summary = page.inner_text("#train-summary")
    assert "examples/sft/math-pairs" in summary and "Group Size" not in summary and "Reward" not in summary
    check_page(page)
    page.click("#start-training")
    page.wait_for_url(re.compile(r"/jobs/[^/]+$"))
    page.wait_for_function("document.body.dataset.live === 'done'", timeout=240_000)
    assert page.inner_text("#job-status .badge") == "completed"
    assert page.text_content("#rl-h").strip().startswith("SFT Metrics")
    assert page.inner_text("[data-tile='Steps']") == "4" and page.locator("[data-tile='Best Reward']").count() == 0
    assert page.locator("[data-trend='Token Accuracy Trend']").count() == 1
    for key in ("token_accuracy", "loss"):
        assert page.evaluate(f"document.getElementById('chart-{key}').naturalWidth") > 0
    assert "Supervised (SFT)" in page.inner_text("aside")
    assert "samples nothing" in page.inner_text("#completions")
    check_page(page)


def test_a_head_job_from_the_training_method_selector(pages: Pages) -> None:
    """Head chosen on the New Training form: its card shows (SFT's, Reward and GRPO hide), the sidebar is
    Head's Training Summary, and the job's page is its Head Metrics card with the held-out charts and
    the reward key it scores as."""
    page = pages.new()
    page.goto("/train")
    assert not page.is_visible("#head-card")
    page.check("#method-3")
    assert page.is_visible("#head-card") and not page.is_visible("#sft-card") and not page.is_visible("#grpo-h")
    assert page.input_value("#f-head-learning_rate") == "0.0001" and page.input_value("#f-head-text_column") == "text"
    page.fill("#f-name", "web head job")
    page.fill("#f-base_model", MODEL)
    page.fill("#f-head-dataset", "examples/head/math-verdicts")
    page.fill("#f-head-max_steps", "3")
    page.fill("#f-head-max_seq_length", "96")
    page.dispatch_event("#f-head-max_seq_length", "change")
    # the dataset itself: "required for a Head job", the summary's message before the fields reach it, says Head too
    page.wait_for_function("document.getElementById('train-summary').innerText.includes('math-verdicts')")
    summary = page.inner_text("#train-summary")
    assert "examples/head/math-verdicts" in summary and "classification" in summary and "Group Size" not in summary
    check_page(page)
    page.click("#start-training")
    page.wait_for_url(re.compile(r"/jobs/[^/]+$"))
    job_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    page.wait_for_function("document.body.dataset.live === 'done'", timeout=240_000)
    assert page.inner_text("#job-status .badge") == "completed"
    assert page.text_content("#rl-h").strip().startswith("Head Metrics")
    assert page.inner_text("[data-tile='Steps']") == "3" and page.locator("[data-tile='Best Reward']").count() == 0
    assert page.locator("[data-trend='Held-out Accuracy Trend']").count() == 1
    for key in ("head_scores", "loss"):
        assert page.evaluate(f"document.getElementById('chart-{key}').naturalWidth") > 0
    assert f"head_{job_id}" in page.inner_text("#completions")
    check_page(page)


def test_job_actions_download_export_merge(pages: Pages, tmp_path: Path) -> None:
    job_id = STATE.get("job") or pytest.skip("no job from the form test")
    page = pages.new()
    page.goto(f"/jobs/{job_id}")
    with page.expect_download() as download:
        page.click("a[href$='/adapter.zip']")
    archive = tmp_path / "adapter.zip"
    download.value.save_as(archive)
    with zipfile.ZipFile(archive) as z:
        names = sorted(Path(n).name for n in z.namelist())
        assert names == ["adapter_config.json", "adapter_model.safetensors"]
        config = json.loads(z.read(next(n for n in z.namelist() if n.endswith("adapter_config.json"))))
    assert (config["r"], config["lora_alpha"]) == (4, 128)
    with page.expect_download() as download:
        page.click("a[href$='/history.csv']")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1)) and "reward_mean" in rows[0]
    with page.expect_download() as download:
        page.click("a[href$='/history.jsonl']")
    lines = Path(download.value.path()).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, STEPS + 1))
    page.select_option("form[data-merge] select[name=dtype]", "bf16")
    page.click("form[data-merge] button")
    page.wait_for_selector(".merge-progress[data-done='true']", timeout=180_000)
    status = page.inner_text(".merge-progress [role=status]")
    assert status.startswith("merged: ") and status.split(" (")[0].endswith("-bf16"), status
    assert page.is_visible(f"a[href='/jobs/{job_id}/merged.zip?dtype=bf16']")


def test_start_an_automated_loop_and_read_its_page(pages: Pages) -> None:
    page = pages.new()
    page.goto("/train#loop")
    fill_job(page, 2)
    page.fill("#f-loop-name", "web e2e loop")
    # Score Column resets to the benchmark's default when the benchmark changes.
    page.select_option("#f-loop-score_column", "format")
    page.select_option("#f-loop-benchmark", "gsm8k")
    assert page.input_value("#f-loop-score_column") == "accuracy"
    page.select_option("#f-loop-benchmark", "rlvr-math-pairs-heldout")
    page.fill("#f-loop-target", "25")
    page.fill("#f-loop-max_rounds", "2")
    page.fill("#f-loop-give_up_after", "2")
    page.fill("#f-loop-benchmark_limit", "32")
    page.click("#start-loop")
    page.wait_for_url(re.compile(r"/loops/[^/]+$"))
    STATE["loop"] = page.url.rsplit("/", 1)[1]
    page.wait_for_function("document.body.dataset.live === 'done'", timeout=420_000)
    assert page.inner_text("#loop-status .badge") == "Rounds spent"
    assert page.inner_text("[data-tile='Rounds']") == "2 of 2" and page.inner_text("[data-tile='Target']") == "25%"
    assert page.evaluate("document.getElementById('chart-scores').naturalWidth") > 0
    rows = page.locator("#loop-rounds tbody tr")
    assert rows.count() == 2 and page.locator("#loop-rounds .badge.BEST").count() == 1
    assert page.locator("#round-2 .arrow").count() == 1  # R2's delta against R1
    job_links = page.locator("#loop-rounds a[href^='/jobs/']")
    assert job_links.count() == 2
    STATE["evaluation"] = page.get_attribute("#round-1 a[href^='/evals/']", "href") or ""
    check_page(page)
    screenshot(page, "loop page", "console-loop.png")
    job_links.first.click()
    page.wait_for_url(re.compile(r"/jobs/[^/]+$"))
    assert page.inner_text("h1") == "web e2e loop R1" and page.inner_text("#job-status .badge") == "completed"


def test_an_evaluation_and_its_wrong_answers(pages: Pages) -> None:
    href = STATE.get("evaluation") or pytest.skip("no evaluation from the loop test")
    page = pages.new()
    page.goto(href)
    for label in ("Accuracy", "Accuracy Strict", "Format", "Answered"):
        assert page.inner_text(f"[data-tile='{label}']").endswith("%")
    assert "of 32" in page.inner_text("#results-count")
    assert page.locator(f"form[action='{href}/cancel']").count() == 0  # completed: no Cancel evaluation
    check_page(page)
    page.click("text=Wrong answers only")
    page.wait_for_url(re.compile(r"wrong=1"))
    classes = page.eval_on_selector_all("#results tbody tr", "rows => rows.map(r => r.className)")
    assert classes and set(classes) == {"wrong"}
    wrong = int(re.search(r"of (\d+) wrong", page.inner_text("#results-count")).group(1))
    assert 0 < wrong <= 32
    page.click("text=Leaderboard of rlvr-math-pairs-heldout")
    page.wait_for_url(re.compile(r"/leaderboard\?benchmark=rlvr-math-pairs-heldout"))
    page.wait_for_load_state()  # a click returns once the navigation starts: count the new page's rows
    # The baseline and both rounds asked the same questions: one table, ranked together.
    assert page.locator("table.leaderboard").first.locator("tbody tr").count() >= 3


def test_every_page_at_390_pixels_with_and_without_javascript(pages: Pages, stack: tuple[object, str]) -> None:
    urls = ["/jobs", "/train", "/loops", "/evals", "/leaderboard"]
    urls += [f"/jobs/{STATE['job']}"] if "job" in STATE else []
    urls += [f"/loops/{STATE['loop']}"] if "loop" in STATE else []
    urls += [STATE["evaluation"]] if STATE.get("evaluation") else []
    started = time.monotonic()
    for javascript in (True, False):
        page = pages.new(width=390, javascript=javascript)
        for url in urls:
            page.goto(url)
            check_page(page, width=390)
            assert page.inner_text("h1")
        if not javascript and "loop" in STATE:  # read-only pages read without a script
            page.goto(f"/loops/{STATE['loop']}")
            assert page.locator("#loop-rounds tbody tr").count() == 2 and "BEST" in page.inner_text("#loop-rounds")
        if not javascript and "job" in STATE:
            page.goto(f"/jobs/{STATE['job']}")
            assert page.inner_text("[data-tile='Steps']") == str(STEPS)
    assert time.monotonic() - started < 120
