"""The web console (clients/web) against in-memory twins of the scheduler and the benchmark service
(tests/web_fakes.py, which validate with the scheduler's own rules): routing, CSRF, the form's
ranges and defaults as the server answers them, errors placed next to their field, downloads,
merge progress and the live streams. The browser test on the real stack is tests/test_web_e2e.py.
"""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import grpc
import pytest
from starlette.testclient import TestClient
from web_fakes import FakeSdk, app_over_fakes

from rlvr import jobspec
from rlvr.clients.web import forms, limits
from rlvr.peers.base import RlvrError
from rlvr.rewards.registry import load_registry
from rlvr.services.scheduler import loopspec
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sdk() -> FakeSdk:
    return FakeSdk()


@pytest.fixture
def client(sdk: FakeSdk) -> TestClient:
    return TestClient(app_over_fakes(sdk), base_url="http://127.0.0.1:8050")


def token(client: TestClient, page: str = "/train") -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', client.get(page).text)
    assert found, "no CSRF token on the page"
    return found.group(1)


def message_of(page: str, path: str) -> str:
    """The text of a field's message slot (error or warning) on a rendered form."""
    field = forms.ALL_FIELDS[path]
    m = re.search(rf'id="{field.id}-msg"[^>]*>(.*?)</p>', page, re.S)
    assert m, f"no message slot for {path}"
    return html.unescape(m.group(1)).strip()


def input_value(page: str, path: str) -> str:
    m = re.search(rf'<input id="{forms.ALL_FIELDS[path].id}" name="{re.escape(path)}" value="([^"]*)"', page)
    assert m, f"no input for {path}"
    return html.unescape(m.group(1))


def default_form(client: TestClient, url: str = "/train") -> dict[str, str]:
    """What the New Training form submits as first shown (its inputs' values, checked boxes only)."""
    page = client.get(url).text
    data: dict[str, str] = {}
    for path, f in forms.ALL_FIELDS.items():
        if f.widget in ("checkbox",):
            if re.search(rf'id="{f.id}" name="{re.escape(path)}" value="on" checked', page):
                data[path] = "on"
        elif f.widget == "radio":
            m = re.search(rf'name="{re.escape(path)}" value="(\d+)" checked', page)
            data[path] = m.group(1) if m else ""
        elif f.widget in ("select", "batch"):
            block = re.search(rf'<select id="{f.id}".*?</select>', page, re.S)
            chosen = re.search(r'<option value="([^"]*)"[^>]* selected', block.group(0)) if block else None
            data[path] = chosen.group(1) if chosen else ""
        else:
            data[path] = input_value(page, path)
    data["csrf_token"] = token(client)
    return data


# ---------------------------------------------------------------- ranges and defaults from the server


def test_the_console_imports_no_service_code() -> None:
    code = ("import sys, rlvr.clients.web.app, rlvr.clients.web.server; "
            "print([m for m in sys.modules if m == 'services' or m.startswith('services.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_ranges_and_defaults_asked_of_the_server_match_jobspec(sdk: FakeSdk) -> None:
    got = limits.ask(sdk.scheduler, sdk.benchmark)
    assert not got.problems
    for path, rng in [("reward.synthetic_prompts", jobspec.SYNTHETIC_PROMPTS), ("grpo.group_size", jobspec.GROUP_SIZE),
                      ("grpo.max_completion_tokens", jobspec.MAX_COMPLETION), ("grpo.lora_rank", jobspec.LORA_RANK),
                      ("grpo.lora_alpha", jobspec.LORA_ALPHA), ("grpo.learning_rate", jobspec.LEARNING_RATE),
                      ("advanced.epochs", jobspec.EPOCHS), ("advanced.kl_beta", jobspec.KL_BETA),
                      ("advanced.temperature", jobspec.TEMPERATURE), ("reward.format_bonus_weight",
                                                                       jobspec.FORMAT_BONUS_WEIGHT),
                      ("advanced.gpu_memory_fraction", jobspec.GPU_MEMORY_FRACTION),
                      ("advanced.checkpoint_every", jobspec.CHECKPOINT_EVERY)]:
        limit = got.limits[path]
        assert (limit.low, limit.high) == pytest.approx((rng.low, rng.high)), path
        assert float(limit.default) == pytest.approx(rng.default), path
    assert got.limits["grpo.batch_size"].choices == tuple(str(b) for b in jobspec.BATCH_SIZES)
    assert got.limits["grpo.batch_size"].default == str(jobspec.BATCH_SIZE_DEFAULT)
    assert (got.limits["grpo.max_steps"].low, got.limits["grpo.max_steps"].high) == (-1, jobspec.MAX_STEPS_HIGH)
    assert got.limits["advanced.lora_init"].choices == jobspec.LORA_INITS
    # the Reward choices are the reward service's rewards, as the scheduler passes them on
    assert got.choices["reward.key"] == [(i.key, i.display_name) for i in load_registry().infos()]
    assert [r.key for r in got.rewards][:3] == ["math_pairs", "gsm8k", "boxed"]
    assert dict(got.choices["advanced.generation_backend"]) == jobspec.BACKEND_NAMES
    assert dict(got.choices["advanced.loss_type"]) == jobspec.LOSS_NAMES
    assert (got.limits["loop.max_rounds"].low, got.limits["loop.max_rounds"].high) == (1, loopspec.MAX_ROUNDS.high)
    assert got.limits["loop.give_up_after"].default == str(loopspec.GIVE_UP_AFTER.default)
    assert got.loop_defaults is not None and got.loop_defaults.benchmark == "rlvr-math-pairs-heldout"
    # The form's first values: the spec's defaults, batch size 4 (not the resolved, rounded 8).
    assert got.default_text("grpo.batch_size") == "4" and got.default_text("grpo.group_size") == "8"
    assert got.default_text("grpo.learning_rate") == "1e-06" and got.default_text("reward.format_bonus") == "on"


def test_the_form_limits_come_from_the_table_not_from_probing_dry_runs(sdk: FakeSdk) -> None:
    got = limits.ask(sdk.scheduler, sdk.benchmark)
    # one dry run each for the resolved defaults; no invalid spec sent to read a range out of its error
    assert sdk.scheduler.calls.count("CreateJob dry") == 1 and sdk.scheduler.calls.count("CreateLoop dry") == 1
    for row in jobspec.SPEC_FIELDS:
        if row.range is not None:
            assert got.limits[row.path].allowed == row.allowed()
            assert (got.limits[row.path].low, got.limits[row.path].high) == (row.range.low, row.range.high)


def test_parse_allowed_reads_the_contract_error_format() -> None:
    limit = limits.parse_allowed("grpo.lora_rank", "grpo.lora_rank: 99 is out of range; allowed: 4-64 (default 8)")
    assert limit is not None and (limit.low, limit.high, limit.default) == (4, 64, "8")
    assert limit.check(4) and limit.check(64) and not limit.check(99) and not limit.check(3)
    lr = limits.parse_allowed("grpo.learning_rate",
                              "grpo.learning_rate: -1.0 is out of range; allowed: 5e-07 to 1e-05 (default 1e-06)")
    assert lr is not None and (lr.low, lr.high, lr.default) == (5e-7, 1e-5, "1e-06")
    assert limits.parse_allowed("grpo.lora_rank", "reward.dataset: required") is None
    words = limits.parse_allowed("advanced.gpu_selection", 'advanced.gpu_selection: \'?\' is out of range; allowed: '
                                 '"auto", "cpu", or a comma list of device indices such as "0,1"')
    assert words is not None and words.low is None and not words.choices  # words only: a hint, no check
    assert limits.parse_choices("x: 99 is out of range; allowed: 1 (vLLM (rollout server)), 2 (Transformers "
                                "(in-process))") == [(1, "vLLM (rollout server)"), (2, "Transformers (in-process)")]


def test_form_fields_map_to_the_contract_and_errors_to_fields() -> None:
    for path in forms.ALL_FIELDS:
        proto_path = path.removeprefix("loop.")
        message = S.LoopSpec() if path.startswith("loop.") else C.JobSpec()
        limits.get_path(message, proto_path)  # every form field is a field of the contract
    assert forms.error_field("grpo.lora_rank: 99 is out of range; allowed: 4-64 (default 8)") == "grpo.lora_rank"
    assert forms.error_field("job.grpo.lora_rank: 99 is out of range", loop=True) == "grpo.lora_rank"
    assert forms.error_field("max_rounds: 9 rounds of job.grpo.lora_rank 8 ...", loop=True) == "loop.max_rounds"
    assert forms.error_field("init_adapter.version: -1 is out of range") == ""
    assert forms.lr_presets(5e-7, 1e-5) == ["5e-7", "1e-6", "2e-6", "5e-6", "1e-5"]
    assert forms.lr_presets(1e-6, 1e-3)[-4:] == ["1e-4", "2e-4", "5e-4", "1e-3"]  # SFT's range


# ---------------------------------------------------------------- the pages


@pytest.mark.parametrize("url, expected", [
    ("/jobs", ["Jobs", "rising", 'role="img"', "step 12"]),
    ("/jobs/job0001", ["RL Metrics", "Accuracy Trend", "Reward Trend", "Best Accuracy", "Final Loss",
                       'id="chart-reward_accuracy"', 'id="chart-loss"', "Download Adapter", "Merge Model", "Export History",
                       "Training Summary", "RLVR (GRPO)"]),
    ("/jobs/job0002", ["no training step recorded yet", 'data-live="/jobs/job0002/events?since=', "Cancel job"]),
    ("/train", ["Reward Function", "GRPO Configuration", "Advanced Options", "Training Summary", "Start Training",
                "Start an automated loop", "Score Column", "Give Up After", "Reclaim storage between rounds",
                "Math Pairs (synthetic)", "Allowed: 4-64 (default 8)"]),
    ("/loops", ["Training Loops", "math-pairs to 70%"]),
    ("/loops/3f9c1a2b4d5e", ["Best score", "Target", "Rounds", "Elapsed", 'id="chart-scores"', "BEST",
                             'href="/jobs/job001abcdef"', "↑", "+7.5"]),
    ("/evals", ["Evaluations", "ev1"]),
    ("/evals/ev1", ["Score Breakdown", "Accuracy Strict", "Format", "Answered", "Detailed Results",
                    "Questions 1–20 of 45"]),
    ("/leaderboard", ["Leaderboard", "RLVR Math Pairs held-out", "ev1", "the first 45 of 500 questions",
                      "n = 45", "20.0%</b> <span class=\"muted\">± 6.0", "the first 32 of 500 questions", "± 7.7"]),
])
def test_pages_render_the_specs_content(client: TestClient, url: str, expected: list[str]) -> None:
    resp = client.get(url)
    assert resp.status_code == 200, resp.text[:2000]
    for text in expected:
        assert text in resp.text, f"{url}: {text!r} missing"
    assert resp.text.count("<h1") == 1


def test_the_evaluation_legend_is_the_one_definition_of_the_score_columns(client: TestClient) -> None:
    """The legend under the score tiles reads rlvr/scores.py's DEFINITIONS, the words the code, the
    proto and docs/evaluations.md use: accuracy strict is about how the answer is written, not the format."""
    from markupsafe import escape

    from rlvr.scores import DEFINITIONS, TITLES

    page = client.get("/evals/ev1").text
    legend = re.search(r'<p class="small muted" id="score-legend">(.*?)</p>', page, re.S)
    assert legend is not None
    spans = dict(re.findall(r'<span data-column="([^"]+)">[^:]+: (.*?)</span>', legend.group(1)))
    assert spans == {TITLES[key]: str(escape(text)) for key, text in DEFINITIONS.items()}
    assert "canonical place" in spans["Accuracy Strict"] and "independent of format" in spans["Accuracy Strict"]
    assert "&lt;/think&gt;&lt;answer&gt;" not in legend.group(1)  # the old, replaced definition


def test_an_adapters_evaluation_is_compared_with_the_base_on_the_same_questions(sdk: FakeSdk,
                                                                                client: TestClient) -> None:
    from rlvr.paired import compare

    bench = sdk.benchmark
    assert "Compared with" not in client.get("/evals/ev1").text  # nothing else asked these questions
    base = B.Evaluation(id="ev0", model="rlvr-tiny", benchmark=bench.evaluation.benchmark, question_set="qs-0123456789ab",
                        status=B.EVALUATION_STATUS_COMPLETED, questions_total=45, questions_done=45)
    base_rows = [B.QuestionResult(index=r.index, accuracy=1.0 if r.index % 9 == 0 else 0.0) for r in bench.results]
    bench.others["ev0"] = (base, base_rows)
    other = B.Evaluation(id="ev9", benchmark=base.benchmark, question_set="qs-ba9876543210",
                         status=B.EVALUATION_STATUS_COMPLETED)
    bench.others["ev9"] = (other, [])
    page = client.get("/evals/ev1").text  # an adapter's: against the base model's by default
    expected = compare([r.accuracy for r in base_rows], [r.accuracy for r in bench.results])
    section = re.search(r'<section class="card" aria-labelledby="compare-h" id="compare">(.*?)</section>', page, re.S)
    assert section is not None
    assert 'value="ev0" selected' in section.group(1) and "ev9" not in section.group(1)  # same questions only
    verdict = re.search(r"<p [^>]*data-verdict>(.*?)</p>", section.group(1), re.S)
    assert verdict is not None and html.unescape(verdict.group(1)) == f"Gain {expected.verdict()}."
    assert f"{expected.gained} / {expected.lost}" in section.group(1) and "base model" in section.group(1)
    assert "ev1" not in re.findall(r'<option value="([^"]*)"', section.group(1))
    refused = client.get("/evals/ev1?compare=ev9").text  # a hand-typed id of other questions: said, not a 500
    assert "asked different questions" in html.unescape(refused)


def test_wrong_answers_filter_and_paging(client: TestClient) -> None:
    page = client.get("/evals/ev1?wrong=1").text
    rows = re.findall(r'<tr class="(right|wrong)">', page)
    assert rows and set(rows) == {"wrong"} and "Questions 1–20 of 36 wrong" in page
    last = client.get("/evals/ev1?wrong=1&page=2").text
    assert "Questions 21–36 of 36 wrong" in last and 'rel="prev"' in last and 'rel="next"' not in last


def test_a_running_evaluation_has_a_cancel_button_and_a_finished_one_none(client: TestClient, sdk: FakeSdk) -> None:
    bench = sdk.benchmark
    running = B.Evaluation(id="evrun", model="rlvr-tiny", benchmark=bench.evaluation.benchmark,
                           status=B.EVALUATION_STATUS_RUNNING, questions_total=45, questions_done=20)
    bench.others["evrun"] = (running, bench.results[:20])
    assert "Cancel evaluation" not in client.get("/evals/ev1").text  # completed: nothing to cancel
    page = client.get("/evals/evrun").text
    assert 'action="/evals/evrun/cancel"' in page and "Cancel evaluation" in page
    t = token(client, "/evals/evrun")
    resp = client.post("/evals/evrun/cancel", data={"csrf_token": t}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/evals/evrun"
    assert bench.calls == ["CancelEvaluation evrun"]
    after = client.get("/evals/evrun").text
    assert "Cancel evaluation" not in after and "reloads every few seconds" not in after
    assert '<span class="badge CANCELLED">cancelled</span>' in after
    assert "Cancelled after 20 of 45 questions; their results are kept." in after and "Questions 1–20 of 20" in after
    refused = client.post("/evals/ev1/cancel", data={"csrf_token": t})  # a stale page's button: said, not a 500
    assert refused.status_code == 409 and "has already ended (COMPLETED)" in refused.text


def test_unknown_ids_and_unreachable_services_are_pages_not_tracebacks(client: TestClient, sdk: FakeSdk) -> None:
    resp = client.get("/jobs/nope")
    assert resp.status_code == 404 and "NOT_FOUND: job &#39;nope&#39; not found" in resp.text

    def down(*args: object, **kwargs: object) -> None:
        raise RlvrError(grpc.StatusCode.UNAVAILABLE, "connection refused", "rlvr.v1.SchedulerService/ListJobs")

    sdk.scheduler.list_jobs = down  # type: ignore[method-assign]
    resp = client.get("/jobs")
    assert resp.status_code == 503 and "the scheduler service at fake:1 did not answer" in resp.text


# ---------------------------------------------------------------- CSRF


def test_posts_need_this_browsers_token_and_this_origin(client: TestClient, sdk: FakeSdk) -> None:
    data = default_form(client)
    good = data.pop("csrf_token")
    for url in ("/train", "/loops", "/train/summary", "/jobs/job0001/merge", "/jobs/job0002/cancel", "/jobs/job0001/delete",
                "/loops/3f9c1a2b4d5e/stop", "/evals/ev1/cancel"):
        assert client.post(url, data=data).status_code == 403, url
        assert client.post(url, data={**data, "csrf_token": "0" * 64}).status_code == 403, url
    # The token belongs to the cookie: another browser's token does not pass.
    other = TestClient(client.app, base_url="http://127.0.0.1:8050")
    assert other.post("/train", data={**data, "csrf_token": good}).status_code == 403
    # Another site posting with a valid pair (it cannot read them, but even so) is refused.
    resp = client.post("/train", data={**data, "csrf_token": good}, headers={"origin": "http://evil.example"})
    assert resp.status_code == 403
    assert not [c for c in sdk.scheduler.calls if not c.endswith(" dry")] and not sdk.benchmark.calls
    resp = client.post("/train", data={**data, "csrf_token": good}, headers={"origin": "http://127.0.0.1:8050"},
                       follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/jobs/job")
    first = TestClient(client.app).get("/jobs").headers["set-cookie"]
    assert first.startswith("rlvr_csrf=") and "HttpOnly" in first and "SameSite=Strict" in first


# ---------------------------------------------------------------- the form


def test_an_invalid_value_is_answered_next_to_its_field_and_nothing_starts(client: TestClient,
                                                                          sdk: FakeSdk) -> None:
    data = default_form(client)
    data["grpo.lora_rank"] = "99"
    jobs = len(sdk.scheduler.jobs)
    resp = client.post("/train", data=data, follow_redirects=False)
    assert resp.status_code == 200
    page = resp.text
    assert message_of(page, "grpo.lora_rank") == "grpo.lora_rank: 99 is out of range; allowed: 4-64 (default 8)"
    assert input_value(page, "grpo.lora_rank") == "99"  # what was typed stays
    assert re.search(r'id="f-grpo-lora_rank"[^>]*aria-invalid="true"', page)
    assert 'href="#f-grpo-lora_rank"' in page  # the error summary links to the field
    assert "CreateJob" in sdk.scheduler.calls and len(sdk.scheduler.jobs) == jobs  # the server said no


def test_every_invalid_value_is_answered_next_to_its_own_field(client: TestClient, sdk: FakeSdk) -> None:
    data = default_form(client)
    data.update({"grpo.lora_rank": "99", "grpo.learning_rate": "0.01"})
    page = client.post("/train", data=data, follow_redirects=False).text
    assert message_of(page, "grpo.lora_rank") == "grpo.lora_rank: 99 is out of range; allowed: 4-64 (default 8)"
    assert message_of(page, "grpo.learning_rate") == ("grpo.learning_rate: 0.01 is out of range; allowed: 5e-07 to "
                                                      "1e-05 (default 1e-06)")
    for f in ("f-grpo-lora_rank", "f-grpo-learning_rate"):
        assert re.search(rf'id="{f}"[^>]*aria-invalid="true"', page) and f'href="#{f}"' in page
    assert message_of(page, "grpo.group_size") == ""  # a good field gets no message
    # the live preview (the sidebar's dry run) places both too
    answer = client.post("/train/summary", data=data).json()
    assert {p for p, m in answer["messages"].items() if m["kind"] == "error"} == {"grpo.lora_rank",
                                                                                 "grpo.learning_rate"}


def test_each_learning_rate_field_offers_the_presets_of_its_own_range(client: TestClient) -> None:
    """RLVR's 5e-7 to 1e-5 and SFT's 1e-6 to 1e-3 (the SFT card's field, hidden until SFT is chosen)."""
    page = client.get("/train").text

    def chips(field: str) -> list[str]:
        return re.findall(rf'data-set="f-{field}" data-value="([^"]+)"', page)

    assert chips("grpo-learning_rate") == ["5e-7", "1e-6", "2e-6", "5e-6", "1e-5"]
    assert chips("sft-learning_rate")[0] == "1e-6" and chips("sft-learning_rate")[-3:] == ["2e-4", "5e-4", "1e-3"]
    assert input_value(page, "sft.learning_rate") == "0.0002"


def test_epsilon_high_is_a_field_with_its_range_from_the_table(client: TestClient, sdk: FakeSdk) -> None:
    page = client.get("/train").text
    assert re.search(r'id="f-advanced-epsilon_high"[^>]*data-low="0.2" data-high="1.0"', page)
    assert input_value(page, "advanced.epsilon_high") == "0.2" and "Allowed: 0.2 to 1 (default 0.2)." in page
    data = default_form(client)
    data["advanced.epsilon_high"] = "0.28"
    resp = client.post("/train", data=data, follow_redirects=False)
    assert resp.status_code == 303
    job = sdk.scheduler.jobs[resp.headers["location"].rsplit("/", 1)[1]]
    assert job.spec.advanced.epsilon_high == pytest.approx(0.28)
    assert "Epsilon high" in client.get(resp.headers["location"]).text  # the Training Summary's row


def test_the_base_model_field_suggests_the_schedulers_models(client: TestClient, sdk: FakeSdk,
                                                              tmp_path: Path) -> None:
    """The Base model field offers what ListModels answers: the bundled models and those imported
    under the scheduler's model roots, each labelled with what it is."""
    from rlvr.models import TINY_MODELS

    folder = tmp_path / "roots" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 49152,
                                                    "max_position_embeddings": 8192, "dtype": "float32"}))
    (folder / "rlvr_import.json").write_text(json.dumps({"recipe": "smollm2-135m"}))
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1500, 100)}, str(folder / "model.safetensors"))  # counted from its header
    sdk.scheduler.model_roots = [tmp_path / "roots"]
    page = client.get("/train").text
    assert re.search(r'id="f-base_model"[^>]*list="f-base_model-models"', page)
    options = re.findall(r'<option value="([^"]+)" label="([^"]*)">', page.split('id="f-base_model-models"')[1]
                         .split("</datalist>")[0])
    assert [name for name, _ in options] == [*TINY_MODELS, "smollm2-135m"]
    assert options[0][1] == "bundled" and options[-1][1] == "0.1M, LlamaForCausalLM, imported: smollm2-135m"


def test_a_non_number_is_refused_before_the_server(client: TestClient, sdk: FakeSdk) -> None:
    data = default_form(client)
    data["grpo.group_size"] = "eight"
    resp = client.post("/train", data=data)
    assert resp.status_code == 200 and message_of(resp.text, "grpo.group_size") == "'eight' is not a whole number"


def test_start_training_rounds_the_batch_size_up_with_the_servers_warning(client: TestClient,
                                                                         sdk: FakeSdk) -> None:
    data = default_form(client)
    assert (data["grpo.batch_size"], data["grpo.group_size"]) == ("4", "8")
    page = client.get("/train").text
    assert "rounded up to 8" in message_of(page, "grpo.batch_size")  # the dry run's warning, beside the field
    resp = client.post("/train", data=data, follow_redirects=False)
    assert resp.status_code == 303
    job = sdk.scheduler.jobs[resp.headers["location"].rsplit("/", 1)[1]]
    assert job.spec.grpo.batch_size == 8 and any("grpo.batch_size" in w for w in job.warnings)
    assert job.spec.reward.format_bonus and not job.spec.reward.dataset and job.spec.grpo.lora_rank == 8
    shown = client.get(resp.headers["location"]).text
    assert "warning: grpo.batch_size 4" in html.unescape(shown)


def test_conditional_fields_are_sent_only_with_their_choice(client: TestClient, sdk: FakeSdk) -> None:
    data = default_form(client)
    data["advanced.gpu_memory_fraction"] = "0.5"  # shown for vLLM (colocate) only
    resp = client.post("/train", data=data, follow_redirects=False)
    assert resp.status_code == 303  # not sent with the rollout server's backend, so not refused
    data["advanced.generation_backend"] = str(C.GENERATION_BACKEND_VLLM_COLOCATE)
    data["reward.key"] = "boxed"  # needs a dataset
    resp = client.post("/train", data=data)
    assert resp.status_code == 200 and message_of(resp.text, "reward.dataset").startswith("reward.dataset: required")


def test_the_environment_fields_are_on_the_form_and_shown_with_an_environment_only(client: TestClient,
                                                                                 sdk: FakeSdk) -> None:
    page = client.get("/train").text
    assert 'name="environment.key"' in page
    for path in ("environment.max_turns", "environment.max_episode_tokens", "environment.settings"):
        assert re.search(rf'data-field="{re.escape(path)}" data-only="environment"', page), path
    data = default_form(client)
    data["environment.max_turns"] = "99"  # not sent without an environment, so not refused
    resp = client.post("/train", data=data, follow_redirects=False)
    assert resp.status_code == 303
    data["environment.key"] = "chess"  # this scheduler knows no environment: named next to the field
    resp = client.post("/train", data=data)
    assert resp.status_code == 200
    assert message_of(resp.text, "environment.key").startswith("environment.key: 'chess' is not an environment")
    assert message_of(resp.text, "environment.max_turns").startswith("environment.max_turns: 99 is out of range")


def test_the_summary_preview_is_a_dry_run(client: TestClient, sdk: FakeSdk) -> None:
    data = default_form(client)
    data["grpo.group_size"] = "4"
    data["grpo.batch_size"] = "2"
    answer = client.post("/train/summary", data=data).json()
    assert "Training Summary" in answer["sidebar"] and "rounded up to 4" in answer["messages"]["grpo.batch_size"]["text"]
    data["grpo.lora_rank"] = "2"
    answer = client.post("/train/summary", data=data).json()
    assert answer["messages"]["grpo.lora_rank"]["kind"] == "error"
    assert "CreateJob" not in sdk.scheduler.calls


def test_start_an_automated_loop(client: TestClient, sdk: FakeSdk) -> None:
    data = default_form(client)
    resp = client.post("/loops", data=data)  # no target
    assert resp.status_code == 200 and message_of(resp.text, "loop.target").startswith("target: 0.0 is out of range")
    data.update({"loop.target": "35%", "loop.max_rounds": "9"})  # 9 rounds of rank 8 exceed rank 64
    resp = client.post("/loops", data=data)
    assert resp.status_code == 200 and message_of(resp.text, "loop.max_rounds").startswith("max_rounds: 9 rounds")
    data.update({"loop.max_rounds": "3", "grpo.lora_rank": "99"})  # CreateLoop's job.* error: the job field
    resp = client.post("/loops", data=data)
    assert resp.status_code == 200 and message_of(resp.text, "grpo.lora_rank").startswith("job.grpo.lora_rank: 99")
    data.update({"grpo.lora_rank": "4", "loop.name": "math-pairs to 35%", "loop.reclaim_storage": ""})
    resp = client.post("/loops", data=data, follow_redirects=False)
    assert resp.status_code == 303
    loop = sdk.scheduler.loops[resp.headers["location"].rsplit("/", 1)[1]]
    assert loop.spec.name == "math-pairs to 35%" and loop.spec.target == 35.0 and loop.spec.max_rounds == 3
    assert not loop.spec.reclaim_storage and loop.spec.score_column == "accuracy"


# ---------------------------------------------------------------- actions


def test_download_adapter_is_a_zip_of_the_peft_folder(client: TestClient) -> None:
    resp = client.get("/jobs/job0001/adapter.zip")
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/zip"
    assert 'filename="job-job0001-adapter.zip"' in resp.headers["content-disposition"]
    with zipfile.ZipFile(io.BytesIO(resp.content)) as z:
        assert sorted(z.namelist()) == ["job-job0001-adapter/adapter_config.json",
                                        "job-job0001-adapter/adapter_model.safetensors"]
        assert z.read("job-job0001-adapter/adapter_model.safetensors") == b"x" * 1000 + b"y" * 1000
    resp = client.get("/jobs/job0002/adapter.zip")  # no adapter yet: the server's reason, as a page
    assert resp.status_code == 409 and "has no adapter yet" in resp.text


def test_export_history(client: TestClient) -> None:
    resp = client.get("/jobs/job0001/history.csv")
    assert resp.text.startswith("step,reward_mean") and 'filename="job-job0001.csv"' in resp.headers["content-disposition"]
    assert client.get("/jobs/job0001/history.jsonl").headers["content-type"].startswith("application/x-ndjson")
    assert client.get("/jobs/job0001/history.xml").status_code == 404
    rounds = client.get("/loops/3f9c1a2b4d5e/rounds.csv")
    assert rounds.text.startswith("round,status,job_id")


def sse(resp) -> list[tuple[str, str]]:  # noqa: ANN001 (an httpx response)
    events, kind, data = [], "message", []
    for line in resp.iter_lines():
        if line.startswith("event:"):
            kind = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data.append(line.split(":", 1)[1].removeprefix(" "))
        elif not line and data:
            events.append((kind, "\n".join(data)))
            kind, data = "message", []
    return events


def test_merge_model_streams_its_progress(client: TestClient, sdk: FakeSdk) -> None:
    t = token(client, "/jobs/job0001")
    with client.stream("POST", "/jobs/job0001/merge", data={"csrf_token": t},
                       headers={"accept": "text/event-stream"}) as resp:
        events = sse(resp)
    progress = [json.loads(d) for k, d in events if k == "progress"]
    assert [p["fraction"] for p in progress] == [0.2, 0.6, 1.0] and progress[-1]["done"]
    assert progress[-1]["path"] == "/srv/merged/x" and progress[-1]["size"] == "2.0 KiB"
    page = client.post("/jobs/job0001/merge", data={"csrf_token": t})  # without JavaScript: waits, then says
    assert page.status_code == 200 and "/srv/merged/x" in page.text and "/jobs/job0001/merged.zip" in page.text
    # The dtype chosen in the form reaches MergeModel, both ways, and the download asks for that merge.
    assert 'name="dtype"' in client.get("/jobs/job0001").text
    with client.stream("POST", "/jobs/job0001/merge", data={"csrf_token": t, "dtype": "bf16"},
                       headers={"accept": "text/event-stream"}) as resp:
        sse(resp)
    page = client.post("/jobs/job0001/merge", data={"csrf_token": t, "dtype": "fp16"})
    assert "/jobs/job0001/merged.zip?dtype=fp16" in page.text
    assert client.get("/jobs/job0001/merged.zip?dtype=fp16").status_code == 200
    calls = sdk.scheduler.calls
    assert "MergeModel job0001 bf16" in calls and "MergeModel job0001 fp16" in calls
    assert "DownloadMergedModel job0001 fp16" in calls


def test_a_finished_job_has_a_delete_button_that_needs_its_box_ticked(client: TestClient, sdk: FakeSdk) -> None:
    page = client.get("/jobs/job0001").text
    assert 'action="/jobs/job0001/delete"' in page and 'name="confirm" value="yes" required' in page
    t = token(client, "/jobs/job0001")
    unticked = client.post("/jobs/job0001/delete", data={"csrf_token": t}, follow_redirects=False)
    assert unticked.status_code == 303 and unticked.headers["location"] == "/jobs/job0001"
    assert "DeleteJob job0001" not in sdk.scheduler.calls
    resp = client.post("/jobs/job0001/delete", data={"csrf_token": t, "confirm": "yes"}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/jobs"
    assert "DeleteJob job0001" in sdk.scheduler.calls and client.get("/jobs/job0001").status_code == 404


def test_a_queued_job_says_why_it_waits(client: TestClient, sdk: FakeSdk) -> None:
    queued = next(j for j in sdk.scheduler.jobs.values() if j.status == C.JOB_STATUS_QUEUED)
    assert "queued: " not in client.get(f"/jobs/{queued.id}").text  # no reason yet: nothing said
    queued.queue_reason = "no trainer worker can run it: precision fp16 needs a CUDA device; worker w1 has none"
    assert f"queued: {queued.queue_reason}" in client.get(f"/jobs/{queued.id}").text


def test_live_job_page_sends_regions_then_done(client: TestClient) -> None:
    with client.stream("GET", "/jobs/job0001/events") as resp:
        events = sse(resp)
    kinds = [k for k, _ in events if k != "ping"]
    assert kinds == ["update", "done"]
    regions = json.loads(events[0][1])
    assert set(regions) == {"job-status", "rl-metrics", "actions", "completions", "job-details"}
    assert regions["completions"].startswith('<section id="completions"') and "Step 12" in regions["completions"]
    assert regions["rl-metrics"].startswith('<section id="rl-metrics"') and "Best Reward" in regions["rl-metrics"]
    assert client.get("/jobs/nope/events").status_code == 404


def test_a_finished_loops_best_round_is_compared_with_its_baseline(sdk: FakeSdk, client: TestClient) -> None:
    from rlvr.paired import compare

    bench = sdk.benchmark
    base_rows = [B.QuestionResult(index=r.index, accuracy=0.0) for r in bench.results]  # 0 right of 45
    bench.others["ev0"] = (B.Evaluation(id="ev0", benchmark=bench.evaluation.benchmark, question_set="qs-0123456789ab",
                                        status=B.EVALUATION_STATUS_COMPLETED), base_rows)
    loop = S.Loop(id="loopdone", status=S.LOOP_STATUS_ROUNDS_SPENT, best_round=1, baseline_evaluation_id="ev0",
                  baseline_score=0.0, best_score=20.0)
    loop.spec.max_rounds = 1
    loop.rounds.add(index=1, evaluation_id="ev1", status=S.ROUND_STATUS_SCORED, score=20.0, best=True)
    sdk.scheduler.loops[loop.id] = loop
    page = html.unescape(client.get("/loops/loopdone").text)
    expected = compare([r.accuracy for r in base_rows], [r.accuracy for r in bench.results])
    line = re.search(r'<p id="loop-paired"[^>]*>(.*?)</p>', page, re.S)
    assert line is not None and expected.real  # 9 of 45 gained, none lost: p = 2 / 2^9
    assert f"Best round R1 against the baseline, question by question: {expected.verdict()}" in line.group(1)
    assert '/evals/ev1?compare=ev0#compare' in page
    loop.baseline_evaluation_id = "gone"
    assert "not comparable" in html.unescape(client.get("/loops/loopdone").text)


def test_live_loop_page_follows_watch_loop(client: TestClient) -> None:
    with client.stream("GET", "/loops/3f9c1a2b4d5e/events") as resp:
        events = [(k, d) for k, d in sse(resp) if k != "ping"]
    kinds = [k for k, _ in events]  # a burst of changes is one update: the latest Loop
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"update"}
    regions = json.loads(events[-2][1])
    assert set(regions) == {"loop-status", "loop-tiles", "loop-chart", "loop-rounds"}
    assert "Stopped" in regions["loop-status"] and "BEST" in regions["loop-rounds"]


# ---------------------------------------------------------------- rlvr web / rlvr up


def test_rlvr_web_and_up_options() -> None:
    import argparse

    from rlvr.clients import cli, stack
    from rlvr.clients.web import server

    assert cli.main(["web", "--help"]) == 0
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", server.DEFAULT_PORT)
    assert server.is_loopback("127.0.0.1") and server.is_loopback("::1") and not server.is_loopback("0.0.0.0")
    up = argparse.ArgumentParser()
    stack.add_up_arguments(up)
    cfg = stack.config_from_args(up.parse_args(["--web-port", "8123"]))
    assert cfg.web_port == 8123 and cfg.web_host == "127.0.0.1" and cfg.web_url == "http://127.0.0.1:8123"
    command = stack.web_command(cfg)
    assert command[1:3] == ["-m", "rlvr.clients.web"] and cfg.addresses["scheduler"] in command
    assert stack.config_from_args(up.parse_args(["--no-web"])).web_port is None
    assert stack.config_from_args(up.parse_args([])).web_port == stack.DEFAULT_WEB_PORT
    assert stack.config_from_args(up.parse_args(["--base-port", "0"])).web_port not in (None, 0, 8050)
    assert stack.config_from_args(up.parse_args(["--base-port", "65531"])).ports["benchmark"] == 65535
    for bad, option, allowed in [(["--base-port", "65532"], "--base-port", "1-65531"),
                                 (["--base-port", "65531", "--rollout-replicas", "2"], "--base-port", "1-65530"),
                                 (["--base-port", "-1"], "--base-port", "0 (free ports)"),
                                 (["--nats-port", "70000"], "--nats-port", "1-65535"),
                                 (["--web-port", "-5"], "--web-port", "1-65535"),
                                 (["--start-timeout", "0"], "--start-timeout", "> 0 seconds"),
                                 (["--memory-fraction", "1.5"], "--memory-fraction", "0 < f <= 1"),
                                 (["--rollout-replicas", "9"], "--rollout-replicas", "1-8"),
                                 (["--max-restarts", "-1"], "--max-restarts", ">= 0")]:
        with pytest.raises(SystemExit, match=f"{option}: .* is out of range; allowed: .*{re.escape(allowed)}"):
            stack.config_from_args(up.parse_args(bad))
    status = argparse.ArgumentParser()
    stack.add_arguments(status)
    assert stack.config_from_args(status.parse_args([])).web_port is None  # `rlvr status`, the demo: no console


def test_the_job_page_says_where_the_job_is_tracked(client: TestClient, sdk: FakeSdk) -> None:
    job = sdk.scheduler.jobs["job0001"]
    job.tracking.add(kind=C.TRACKER_KIND_TENSORBOARD, location="/runs/tb/rising-job0001", steps_logged=12,
                     finished=True)
    job.tracking.add(kind=C.TRACKER_KIND_MLFLOW, location="http://mlflow.example:5000/#/experiments/1/runs/abc",
                     steps_logged=12, finished=True)
    job.tracking.add(kind=C.TRACKER_KIND_WANDB, location="/runs/wandb/wandb", error="OSError: disk full")
    page = client.get("/jobs/job0001").text
    assert "Tracked in tensorboard</th><td><code>/runs/tb/rising-job0001</code>" in page
    assert "(12 steps logged, finished)" in page
    assert '<a href="http://mlflow.example:5000/#/experiments/1/runs/abc" rel="noopener noreferrer"' in page
    assert "Tracked in wandb" in page and "(not logging: OSError: disk full)" in page
    assert "Tracked in" not in client.get("/jobs/job0002").text


# ---------------------------------------------------------------- completions and episodes

TRANSCRIPT = ("[turn 1] Let me compute.\n<tool_call>{}</tool_call>\n[tool calculate] 77\n"
              "[tool calculate] error: division by zero\n[environment] Higher: <try> again\n"
              "[turn 2] <answer>77</answer>\n[failed] the environment died")


def episode_entries(page: str) -> list[tuple[str, str]]:
    """(class, heading) of each episode entry on the page, in order."""
    return [(m[1].strip(), html.unescape(re.sub(r"<[^>]+>", "", m[2])).strip())
            for m in re.finditer(r'<li class="ep ([^"]+)">\s*<div class="ep-who">(.*?)</div>', page, re.S)]


def test_the_job_page_shows_the_latest_steps_completions(client: TestClient, sdk: FakeSdk) -> None:
    page = client.get("/jobs/job0001").text
    card = page[page.index('<section id="completions"'):]
    card = card[:card.index("</section>")]
    assert [int(n) for n in re.findall(r"<h3 class=\"sample-step\">Step (\d+)</h3>", card)] == [12, 11, 10]
    assert card.count('<details class="sample"') == 6 and card.count('<details class="sample" open') == 1
    assert "reward <b>1.000</b> · accuracy <b>1.00</b>" in card and "Add 12 and 1" in card  # the prompt's tail
    assert "&lt;think&gt;12+1&lt;/think&gt;&lt;answer&gt;13&lt;/answer&gt;" in card  # escaped, as sampled
    assert "Reason, then answer." in card  # the whole prompt, folded
    assert 'class="episode"' not in card  # single answers: no turns
    queued = client.get("/jobs/job0002").text
    assert "The trainer's sampled completions appear here after the first step." in queued
    assert "GetJobSamples" not in " ".join(sdk.scheduler.calls)


def test_an_episode_job_shows_each_sample_turn_by_turn(client: TestClient, sdk: FakeSdk) -> None:
    job = sdk.scheduler.jobs["job0001"]
    job.spec.environment.key = "calculator"
    latest = sdk.scheduler.samples[job.id][-1]
    latest.samples[0].completion = TRANSCRIPT
    page = client.get("/jobs/job0001").text
    assert "each is an episode in the <code>calculator</code> environment, turn by turn" in page
    assert episode_entries(page) == [("ep-assistant", "Assistant · turn 1"), ("ep-tool", "Tool result · calculate"),
                                     ("ep-tool ep-error", "Tool error · calculate"),
                                     ("ep-environment", "Environment"), ("ep-assistant", "Assistant · turn 2"),
                                     ("ep-failed ep-error", "Episode failed")]
    assert "· 2 turns" in page
    assert '<pre class="completion">Let me compute.\n&lt;tool_call&gt;{}&lt;/tool_call&gt;</pre>' in page
    assert '<pre class="completion">Higher: &lt;try&gt; again</pre>' in page  # escaped
    assert '<pre class="completion">the environment died</pre>' in page
    # the other sample of the step is a plain answer (no transcript): shown as it is
    assert "&lt;think&gt;12+1&lt;/think&gt;" in page


def test_the_completions_card_says_when_the_samples_cannot_be_read(client: TestClient, sdk: FakeSdk) -> None:
    def unavailable(*_: object, **__: object) -> None:
        raise RlvrError(grpc.StatusCode.UNAVAILABLE, "the event stream could not be read",
                        "rlvr.v1.SchedulerService/GetJobSamples")

    sdk.scheduler.get_job_samples = unavailable  # type: ignore[method-assign]
    resp = client.get("/jobs/job0001")
    assert resp.status_code == 200 and "RL Metrics" in resp.text
    assert "Completions unavailable: UNAVAILABLE: the event stream could not be read" in resp.text
    sdk.scheduler.samples.clear()
    del sdk.scheduler.get_job_samples
    assert "No completions kept for the latest steps" in client.get("/jobs/job0001").text


def test_an_evaluation_row_with_an_episode_shows_it_turn_by_turn(client: TestClient, sdk: FakeSdk) -> None:
    ev = sdk.benchmark.evaluation
    ev.environment.key, ev.environment.version = "calculator", "1"
    row = sdk.benchmark.results[0]
    row.completion = TRANSCRIPT
    row.episode = json.dumps({"turns": [
        {"assistant": "Let me compute.", "tool_calls": [{"name": "calculate", "arguments": {"expression": "7*11"},
                                                         "result": "77", "error": "", "seconds": 0.01}],
         "reply": "Higher: <try> again", "reward": None, "sampled_tokens": 12, "finish_reason": "stop"},
        {"assistant": "<answer>77</answer>", "tool_calls": [], "reply": None, "reward": None, "sampled_tokens": 5,
         "finish_reason": "length"}], "ended_by": "length", "error": "", "truncated": True, "tool_calls": 1,
        "tool_errors": 0, "state": {}, "seconds": 0.3})
    sdk.benchmark.results[1].completion = TRANSCRIPT  # no JSON kept: its transcript, turn by turn
    page = client.get("/evals/ev1").text
    first = page[page.index('<td class="num">0</td>'):page.index('<td class="num">1</td>')]
    assert episode_entries(first) == [("ep-assistant", "Assistant · turn 1 12 tokens"),
                                      ("ep-tool", 'Tool result · calculate {"expression": "7*11"}'),
                                      ("ep-environment", "Environment"),
                                      ("ep-assistant", "Assistant · turn 2 5 tokens · cut (length)")]
    assert "show 2 turns, ended by length, 1 tool call, truncated" in first
    assert '<pre class="completion">Higher: &lt;try&gt; again</pre>' in first
    second = page[page.index('<td class="num">1</td>'):page.index('<td class="num">2</td>')]
    assert [c for c, _ in episode_entries(second)] == ["ep-assistant", "ep-tool", "ep-tool ep-error",
                                                       "ep-environment", "ep-assistant", "ep-failed ep-error"]
    third = page[page.index('<td class="num">2</td>'):page.index('<td class="num">3</td>')]
    assert 'class="episode"' not in third and "<summary>show</summary>" in third  # a single answer, as before


def test_the_measured_recipe_fills_the_form_in_one_action_and_says_where_its_figures_come_from(
        client: TestClient, sdk: FakeSdk) -> None:
    from rlvr.jobspec import FIELDS_BY_PATH, value_of
    from rlvr.recipes import recipe_for

    recipe = recipe_for("rlvr-tiny-headroom")
    assert recipe is not None
    assert 'href="/train?recipe=rlvr-tiny-headroom"' in client.get("/train").text
    page = client.get("/train?recipe=rlvr-tiny-headroom").text
    assert f"Filled with the measured recipe of <b>rlvr-tiny-headroom</b>: {recipe.source}" in html.unescape(page)
    assert input_value(page, "base_model") == "rlvr-tiny-headroom"
    assert input_value(page, "grpo.learning_rate") == "1e-05" and input_value(page, "grpo.max_steps") == "60"
    data = default_form(client, "/train?recipe=rlvr-tiny-headroom")
    data["reward.key"] = "math_pairs"  # the radio's checked value (default_form reads numeric ones only)
    resp = client.post("/train", data=data, follow_redirects=False)
    assert resp.status_code == 303, resp.text
    job = sdk.scheduler.jobs[resp.headers["location"].rsplit("/", 1)[1]]
    assert job.spec.base_model == "rlvr-tiny-headroom"
    for path, value in recipe.fields.items():  # every value of the recipe reached the job
        assert value_of(job.spec, FIELDS_BY_PATH[path]) == pytest.approx(value), path
    unknown = client.get("/train?recipe=rlvr-tiny").text
    assert "no measured recipe for &#39;rlvr-tiny&#39;; models with one: rlvr-tiny-headroom, smollm2-135m" in unknown
