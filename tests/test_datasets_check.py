"""CreateJob's dataset check (services/scheduler/datasets.py): a Boxed-answer job whose data cannot be
trained on is INVALID_ARGUMENT naming reward.dataset or reward.dataset_split, and nothing is queued."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_scheduler_jobs import FakeWorkers

from rlvr.common.errors import InvalidArgument
from rlvr.infra.store import Store
from rlvr.jobspec import resolve_spec
from rlvr.services.scheduler.datasets import check_dataset
from rlvr.services.scheduler.jobs import JobManager
from rlvr.v1 import common_pb2 as C


def boxed(dataset: str, split: str = "") -> C.RewardConfig:
    spec = C.JobSpec()
    spec.reward.function, spec.reward.dataset, spec.reward.dataset_split = C.REWARD_FUNCTION_BOXED, dataset, split
    return resolve_spec(spec).spec.reward


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    (root / "good.jsonl").write_text(json.dumps({"prompt": "1+1?", "ground_truth": "2"}) + "\n")
    (root / "wrong.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    (root / "good.csv").write_text("prompt,ground_truth\n1+1?,2\n")
    folder = root / "split-set"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text(json.dumps({"prompt": "q", "ground_truth": "1"}) + "\n")
    return root


def test_local_data_that_can_be_trained_on_passes(data: Path) -> None:
    check_dataset(boxed(str(data / "good.jsonl")), [data])
    check_dataset(boxed(str(data / "good.csv")), [data])
    check_dataset(boxed(str(data / "split-set"), "test"), [data])
    check_dataset(C.RewardConfig(function=C.REWARD_FUNCTION_GSM8K), [])  # nothing to read for the built-ins


@pytest.mark.parametrize(("dataset", "split", "message"), [
    ("{root}/missing.jsonl", "", "reward.dataset: dataset file '{root}/missing.jsonl' does not exist"),
    ("/etc/hosts.jsonl", "", "reward.dataset: dataset path '/etc/hosts.jsonl' is outside the allowed data roots"),
    ("{root}/wrong.jsonl", "", "reward.dataset: '{root}/wrong.jsonl' (train) has no 'prompt' and no 'ground_truth' "
                               "column; columns present: ['question', 'answer']"),
    ("{root}/good.jsonl", "test", "reward.dataset_split: 'test' is not a split of '{root}/good.jsonl'; it has: train"),
    ("{root}/split-set", "dev", "reward.dataset_split: 'dev' is not a split of '{root}/split-set'; it has: test, "
                                "train"),
    ("not a name!", "", "reward.dataset: dataset 'not a name!' is neither a data file"),
    ("someone/math-set", "", "reward.dataset: 'someone/math-set' names a Hugging Face hub dataset, and the hub is "
                             "not reachable from the scheduler"),
])
def test_data_that_cannot_be_trained_on_is_named(data: Path, monkeypatch: pytest.MonkeyPatch, dataset: str,
                                                 split: str, message: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # this machine reaches no hub; say so without waiting
    with pytest.raises(InvalidArgument) as err:
        check_dataset(boxed(dataset.format(root=data), split), [data])
    assert str(err.value).startswith(message.format(root=data)), str(err.value)


async def test_create_job_refuses_unreadable_data_and_creates_nothing(data: Path, tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    store.create_all()
    jobs = JobManager(store, None, FakeWorkers(), data_roots=[data])
    spec = C.JobSpec()
    spec.reward.function, spec.reward.dataset = C.REWARD_FUNCTION_BOXED, str(data / "wrong.jsonl")
    with pytest.raises(InvalidArgument, match="reward.dataset: .* has no 'prompt'"):
        await jobs.create(spec, dry_run=False)
    with pytest.raises(InvalidArgument, match="reward.dataset"):
        await jobs.create(spec, dry_run=True)  # a dry run checks the same
    assert store.count_jobs() == 0
    spec.reward.dataset = str(data / "good.jsonl")
    _, job = await jobs.create(spec, dry_run=False)
    assert job is not None and store.count_jobs() == 1
    store.close()


@pytest.mark.parametrize(("base_model", "message"), [
    ("../../etc/passwd", "base_model: '../../etc/passwd' is a local path outside the model roots"),
    ("/etc/passwd", "base_model: '/etc/passwd' is a local path outside the model roots"),
    ("~/../../etc", "base_model: '~/../../etc' is a local path outside the model roots"),
    ("{roots}/../escape", "base_model: '{roots}/../escape' is a local path outside the model roots"),
    ("Qwen/Qwen2.5\x00-0.5B", "base_model: 'Qwen/Qwen2.5\\x00-0.5B' contains a control character"),
    ("rlvr-\ttiny", "base_model: 'rlvr-\\ttiny' contains a control character"),
    ("Qwen/Qwen2.5; rm -rf ~", "base_model: 'Qwen/Qwen2.5; rm -rf ~' is not a hub id"),
    ("$(reboot)", "base_model: '$(reboot)' is not a hub id"),
    ("model`id`", "base_model: 'model`id`' is not a hub id"),
    ("a/b/c", "base_model: 'a/b/c' is not a hub id"),
    ("owner/-name", "base_model: 'owner/-name' is not a hub id"),
])
async def test_create_job_refuses_a_base_model_no_worker_may_load_and_creates_nothing(
        tmp_path: Path, base_model: str, message: str) -> None:
    """A base model is a bundled name, a well-formed hub id, or a local path under the model roots
    (symlinks, ~ and .. resolved first): anything else is INVALID_ARGUMENT naming base_model, in a
    dry run and live, and nothing is created. The message never names the server's roots."""
    roots = tmp_path / "models"
    (roots / "mine").mkdir(parents=True)
    store = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    store.create_all()
    jobs = JobManager(store, None, FakeWorkers(), model_roots=[roots])
    spec = C.JobSpec(base_model=base_model.format(roots=roots))
    for dry_run in (True, False):
        with pytest.raises(InvalidArgument) as err:
            await jobs.create(spec, dry_run=dry_run)
        assert str(err.value).startswith(message.format(roots=roots)), str(err.value)
        assert "allowed: a bundled model (rlvr-tiny" in str(err.value)
        assert str(roots) not in str(err.value).replace(base_model.format(roots=roots), "")
    assert store.count_jobs() == 0
    # (a bare name such as gpt2 is tested in tests/test_model_import.py: it depends on the hub's reach)
    for good in ("rlvr-tiny-test", "Qwen/Qwen2.5-0.5B-Instruct", str(roots / "mine"), str(roots / "later")):
        resolved, job = await jobs.create(C.JobSpec(base_model=good), dry_run=False)
        assert job is not None and resolved.spec.base_model == good
    assert store.count_jobs() == 4
    store.close()
