"""JobSpec.environment through the one spec table: the key checked against a catalog of
environments (two fake declarations here), its ranges, its defaults filled from the environment and
the per-turn cap, every bad field at once, the Training Summary's rows, the trainer's JobConfig, the
CLI's flags, the console form, and CreateJob's check of the dataset's columns."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from rlvr.common.errors import FailedPrecondition, InvalidArgument
from rlvr.environments.base import EnvironmentInfo
from rlvr.jobspec import EnvironmentChoices, resolve_spec, settings_of
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T

CALCULATOR = EnvironmentInfo(key="calculator", display_name="Calculator", version="3", max_turns=6,
                             tools=("calculate",))
WORDLE = EnvironmentInfo(key="wordle", display_name="Wordle", columns=("target_word",), max_turns=8)
CATALOG = EnvironmentChoices({e.key: e for e in (CALCULATOR, WORDLE)}, failed={"broken": "ImportError: no gym"})


def job(key: str = "calculator", **fields: object) -> C.JobSpec:
    spec = C.JobSpec()
    spec.environment.key = key
    for name, value in fields.items():
        if name == "settings":
            spec.environment.settings.update(value)  # type: ignore[arg-type]
        else:
            setattr(spec.environment, name, value)
    return spec


def bad_fields(spec: C.JobSpec) -> list[tuple[str, str]]:
    with pytest.raises(InvalidArgument) as e:
        resolve_spec(spec, environments=CATALOG)
    assert [f"{f}: {d}" for f, d in e.value.violations] == str(e.value).split("\n")
    return list(e.value.violations)


def test_no_environment_is_a_single_answer_job_and_its_fields_are_ignored_with_a_warning() -> None:
    plain = resolve_spec(C.JobSpec(), environments=CATALOG)
    assert not plain.spec.HasField("environment") and not any("environment" in w for w in plain.warnings)
    assert not any(path.startswith("environment.") for path in plain.summary.settings)
    stray = resolve_spec(job("", max_turns=99, settings={"level": "hard"}), environments=CATALOG)
    assert not stray.spec.HasField("environment")  # the range of an ignored field is not checked
    assert "environment.settings, environment.max_turns are ignored without an environment (environment.key " \
           "is empty)" in stray.warnings


def test_defaults_are_filled_from_the_environment_and_the_per_turn_cap() -> None:
    r = resolve_spec(job(), environments=CATALOG)
    e = r.spec.environment
    assert (e.key, e.max_turns, e.max_episode_tokens, e.version) == ("calculator", 6, 4 * 256, "3")
    assert resolve_spec(r.spec, environments=CATALOG).spec == r.spec  # the trainer's re-check: unchanged
    spec = job(max_turns=2, max_episode_tokens=5000, settings={"level": "hard"})
    spec.grpo.max_completion_tokens = 512
    e = resolve_spec(spec, environments=CATALOG).spec.environment
    assert (e.max_turns, e.max_episode_tokens, dict(e.settings)) == (2, 5000, {"level": "hard"})
    spec.ClearField("environment")
    spec.environment.key = "calculator"
    assert resolve_spec(spec, environments=CATALOG).spec.environment.max_episode_tokens == 4 * 512
    spec.environment.version = "999"  # output only: the catalog's version is recorded
    assert resolve_spec(spec, environments=CATALOG).spec.environment.version == "3"


def test_an_unknown_environment_lists_the_known_ones() -> None:
    assert bad_fields(job("chess")) == [("environment.key", "'chess' is not an environment; known: calculator, wordle")]
    assert bad_fields(job("Not A Key"))[0][0] == "environment.key"
    with pytest.raises(FailedPrecondition, match="environment.key: environment 'broken' could not be loaded: "
                                                 "ImportError: no gym"):
        resolve_spec(job("broken"), environments=CATALOG)


def test_without_a_registry_no_environment_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback catalog: this process's registry, or none at all before it is installed."""
    import sys

    monkeypatch.setitem(sys.modules, "rlvr.environments.registry", None)  # import fails: ImportError
    with pytest.raises(InvalidArgument, match="environment.key: 'calculator' is not an environment; known: none"):
        resolve_spec(job())
    assert not resolve_spec(C.JobSpec()).spec.HasField("environment")


@pytest.mark.parametrize("field,value,allowed", [
    ("max_turns", 65, "1-64 (default 0: the environment's declared max_turns)"),
    ("max_turns", -1, "1-64 (default 0: the environment's declared max_turns)"),
    ("max_episode_tokens", 63, "64-32768 (default 0: 4 x Max completion)"),
    ("max_episode_tokens", 32769, "64-32768 (default 0: 4 x Max completion)"),
])
def test_ranges(field: str, value: int, allowed: str) -> None:
    assert bad_fields(job(**{field: value})) == [(f"environment.{field}", f"{value} is out of range; allowed: {allowed}")]


def test_edges_of_the_ranges_pass() -> None:
    for turns, tokens in ((1, 64), (64, 32768)):
        e = resolve_spec(job(max_turns=turns, max_episode_tokens=tokens), environments=CATALOG).spec.environment
        assert (e.max_turns, e.max_episode_tokens) == (turns, tokens)


def test_an_episode_cap_below_one_turn_is_a_warning() -> None:
    r = resolve_spec(job(max_episode_tokens=100), environments=CATALOG)
    assert any("environment.max_episode_tokens 100 is below grpo.max_completion_tokens 256" in w for w in r.warnings)


def test_settings_are_checked() -> None:
    assert bad_fields(job(settings={"1st": "x", "ok": "y" * 1025})) == [
        ("environment.settings", "the key '1st' is not allowed; use 1-64 letters, digits and _, starting with a letter"),
        ("environment.settings", "the value of 'ok' has 1025 characters, over the limit of 1024")]
    assert bad_fields(job(settings={f"k{i}": "v" for i in range(33)})) == [
        ("environment.settings", "'33 settings' is out of range; allowed: at most 32")]


def test_every_bad_field_at_once() -> None:
    spec = job("chess", max_turns=0, max_episode_tokens=5, settings={"bad key": "v"})
    spec.grpo.lora_rank = 99
    spec.environment.max_turns = 100
    assert [f for f, _ in bad_fields(spec)] == ["grpo.lora_rank", "environment.key", "environment.max_turns",
                                                "environment.max_episode_tokens", "environment.settings"]
    spec.environment.key = "x" * 200  # over its size limit: named once, not looked up
    assert [f for f, _ in bad_fields(spec)].count("environment.key") == 1


def test_an_environment_reading_a_column_the_reward_s_own_prompts_lack_is_refused() -> None:
    assert bad_fields(job("wordle")) == [(
        "environment.key", "'wordle' reads the column 'target_word', which Math Pairs (synthetic)'s own prompts do "
                           "not have (they have: no other columns); give a reward.dataset holding it")]
    with_data = job("wordle")
    with_data.reward.function, with_data.reward.dataset = C.REWARD_FUNCTION_BOXED, "/data/words.jsonl"
    assert resolve_spec(with_data, environments=CATALOG).spec.environment.key == "wordle"  # checked at CreateJob


def test_the_training_summary_shows_the_environment_and_max_turns() -> None:
    summary = resolve_spec(job(), environments=CATALOG).summary
    assert summary.settings["environment.key"] == "calculator" and summary.settings["environment.max_turns"] == "6"
    from rlvr.clients.views.jobs import summary_rows

    rows = dict(summary_rows(summary))
    assert (rows["Environment"], rows["Max turns"]) == ("calculator", "6")
    assert "Environment" not in dict(summary_rows(resolve_spec(C.JobSpec()).summary))
    plain = settings_of(C.JobSpec())  # a job without an environment: none of its rows
    assert "advanced.epsilon_high" in plain and not [k for k in plain if k.startswith("environment.")]


def test_the_trainer_s_job_config_carries_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rlvr.jobspec import environment as jobspec_environment
    from rlvr.services.trainer.job.config import JobConfig, job_config, job_config_from_request

    spec = resolve_spec(job(settings={"level": "hard"}), environments=CATALOG).spec
    monkeypatch.setattr(jobspec_environment, "_environment_catalog", lambda: CATALOG)  # the worker's registry
    config = job_config_from_request(T.StartJobRequest(job_id="j1", spec=spec), tmp_path)
    assert (config.environment, config.environment_settings, config.max_turns, config.max_episode_tokens,
            config.environment_version) == ("calculator", {"level": "hard"}, 6, 1024, "3")
    assert JobConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    # a config.json written before the sampling controls existed (a job orphaned across an upgrade)
    older = {k: v for k, v in json.loads(json.dumps(config.to_json())).items()
             if k not in ("top_p", "top_k", "min_p", "repetition_penalty")}
    assert JobConfig.from_json(older) == config  # the controls off, as it sampled
    plain = job_config("j2", "rlvr-tiny", tmp_path)
    assert (plain.environment, plain.environment_settings, plain.max_turns, plain.max_episode_tokens) == ("", {}, 0, 0)
    assert {"environment", "environment_settings", "max_turns", "max_episode_tokens"} <= {
        f.name for f in dataclasses.fields(JobConfig)}


def test_the_cli_flags_set_the_spec() -> None:
    from rlvr.clients.commands.train import add_train_arguments, spec_from_args

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    spec = spec_from_args(parser.parse_args([
        "--environment", "calculator", "--max-turns", "5", "--max-episode-tokens", "900",
        "--environment-setting", "level=hard", "--environment-setting", "expr=a=b"]))
    assert (spec.environment.key, spec.environment.max_turns, spec.environment.max_episode_tokens) == (
        "calculator", 5, 900)
    assert dict(spec.environment.settings) == {"level": "hard", "expr": "a=b"}
    assert not spec_from_args(parser.parse_args([])).HasField("environment")  # unset: no environment
    with pytest.raises(SystemExit):
        parser.parse_args(["--environment-setting", "no-equals-sign"])


def test_the_console_form_reads_the_environment_fields() -> None:
    from rlvr.clients.web import forms

    form = {"environment.key": "calculator", "environment.max_turns": "3",
            "environment.settings": "level=hard, seed=7\nmode = fast"}
    spec, errors = forms.job_spec(form)
    assert not errors and spec.environment.key == "calculator" and spec.environment.max_turns == 3
    assert dict(spec.environment.settings) == {"level": "hard", "seed": "7", "mode": "fast"}
    spec, _ = forms.job_spec({"environment.max_turns": "3"})  # no environment: its fields are not sent
    assert not spec.HasField("environment")
    _, errors = forms.job_spec({"environment.key": "calculator", "environment.settings": "level"})
    assert errors == {"environment.settings": "'level' is not KEY=VALUE"}


async def test_create_job_names_a_dataset_column_the_environment_reads(tmp_path: Path) -> None:
    from test_scheduler_jobs import FakeWorkers

    from rlvr.infra.store import Store
    from rlvr.services.scheduler.jobs import JobManager

    data = tmp_path / "data"
    data.mkdir()
    (data / "plain.jsonl").write_text(json.dumps({"prompt": "guess", "ground_truth": "crane"}) + "\n")
    (data / "words.jsonl").write_text(json.dumps({"prompt": "guess", "ground_truth": "crane",
                                                  "target_word": "crane"}) + "\n")
    store = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    store.create_all()
    jobs = JobManager(store, None, FakeWorkers(), data_roots=[data], environments=CATALOG)
    spec = job("wordle")
    spec.reward.function, spec.reward.dataset = C.REWARD_FUNCTION_BOXED, str(data / "plain.jsonl")
    for dry_run in (True, False):
        with pytest.raises(InvalidArgument, match=r"reward.dataset: .* has no 'target_word' column, which the Wordle "
                                                  r"environment \(wordle\) reads"):
            await jobs.create(spec, dry_run=dry_run)
    assert store.count_jobs() == 0
    spec.reward.dataset = str(data / "words.jsonl")
    resolved, created = await jobs.create(spec, dry_run=False)
    assert created is not None and created.spec.environment.version == "1"
    assert resolved.summary.settings["environment.max_turns"] == "8"
    store.close()


def test_a_setting_the_environment_does_not_take_is_refused_naming_those_it_takes() -> None:
    takes = dataclasses.replace(WORDLE, columns=(), settings=("max_misses", "lang"))
    catalog = EnvironmentChoices({"calculator": dataclasses.replace(CALCULATOR, settings=()), "wordle": takes})
    with pytest.raises(InvalidArgument) as e:
        resolve_spec(job("wordle", settings={"max_misses": "3", "lnag": "en"}), environments=catalog)
    assert e.value.violations == [("environment.settings", "'wordle' takes no setting 'lnag'; it takes: max_misses, lang")]
    with pytest.raises(InvalidArgument, match="'calculator' takes no setting 'digits'; it takes: none"):
        resolve_spec(job("calculator", settings={"digits": "2"}), environments=catalog)
    resolve_spec(job("wordle", settings={"lang": "en"}), environments=catalog)  # a setting it takes
    resolve_spec(job("wordle", settings={"anything": "x"}), environments=EnvironmentChoices({"wordle": dataclasses.replace(WORDLE, columns=())}))  # not declared: passed on


def test_dynamic_sampling_is_refused_with_an_environment() -> None:
    spec = job("calculator")
    spec.advanced.dynamic_sampling = True
    assert ("advanced.dynamic_sampling", "not available with an environment (environment.key 'calculator'); "
            "turn it off") in bad_fields(spec)


def test_the_environment_decorator_declares_the_settings_its_class_takes() -> None:
    from rlvr.environments import Environment, environment

    @environment("takes_two")
    class TakesTwo(Environment):
        def __init__(self, size: str = "3", mode: str = "easy") -> None:
            self.size, self.mode = size, mode

    @environment("takes_any")
    class TakesAny(Environment):
        def __init__(self, **settings: str) -> None:
            self.settings = settings

    assert TakesTwo.settings == ("size", "mode") and TakesTwo.info().settings == ("size", "mode")
    assert TakesAny.settings is None
