"""The evaluation core without gRPC or NATS: the runner, the manager's lifecycle, the score
breakdown, the leaderboard and every way a request is refused before generation, over in-process
twins of the rollout and reward services (real task data, real scoring functions) and a real store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound
from rlvr.infra.schema import EvaluationRow
from rlvr.infra.store import Store
from rlvr.peers.types import AdapterTag, Sampling, Score, ScoreInput
from rlvr.rewards.registry import Catalog, load_registry
from rlvr.rewards.scoring import score
from rlvr.services.benchmark.catalog import benchmarks_of, tally
from rlvr.services.benchmark.evaluations import INTERRUPTED, EvaluationManager
from rlvr.services.benchmark.events import MemoryEvents
from rlvr.services.benchmark.planning import RolloutModel
from rlvr.services.benchmark.runner import Answer, Question, run_questions
from rlvr.tasks import Problem, TaskError, get_task, heldout_split
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C

Script = Callable[[Question, AdapterTag], tuple[str, str]]  # -> (completion, "STOP" | "LENGTH")


def solve(question: Question, adapter: AdapterTag) -> tuple[str, str]:
    """Cut off on every third question; else right on even ones (in the full format, but without
    the <think> block on question 4), and a loose wrong answer on odd ones."""
    if question.index % 3 == 2:
        return "<think>1+1=2 and then", "LENGTH"
    if question.index == 4:
        return f"<answer>{question.ground_truth}</answer>", "STOP"
    if question.index % 2 == 0:
        return f"<think>ok</think><answer>{question.ground_truth}</answer>", "STOP"
    return "I think it is 0", "STOP"


@dataclass
class LocalPeers:
    """planning.Peers, Generator and Scorer in-process: tasks from rlvr.tasks, scoring from the reward
    service's pure functions, answers from `script`."""

    script: Script = solve
    model: str = "tiny-local"
    adapters: dict[str, int] = field(default_factory=dict)
    data_roots: Sequence[Path] = ()
    generate_calls: int = 0
    uploads: list[tuple[str, int, Path]] = field(default_factory=list)
    fail_generate_at: int | None = None  # raise on this call (0-based)
    stamp: AdapterTag | None = None  # stamp every answer with this instead of the requested adapter

    def __post_init__(self) -> None:
        self.generator = self
        self.scorer = self

    async def rollout_model(self) -> RolloutModel:
        return RolloutModel(self.model, 512, "local")

    async def live_adapters(self) -> dict[str, int]:
        return dict(self.adapters)

    async def upload_adapter(self, name: str, version: int, directory: Path) -> int:
        self.uploads.append((name, version, directory))
        self.adapters[name] = version
        return version

    async def fetch_adapter(self, path: str, directory: Path) -> str | None:
        return None  # no trainer worker: local folders only

    async def problems(self, function: str, limit: int, dataset: str, split: str) -> list[Problem]:
        try:  # the reward service answers a TaskError with INVALID_ARGUMENT
            task = get_task(function, dataset=dataset or None, data_roots=self.data_roots)
            split = split or (heldout_split(task.splits(), dataset) if function == "boxed" else "test")
            return task.prompts(n=limit or None, split=split, shuffle=False)
        except TaskError as e:
            raise InvalidArgument(str(e)) from None

    async def generate(self, questions: Sequence[Question], sampling: Sampling, adapter: AdapterTag) -> list[Answer]:
        call = self.generate_calls
        self.generate_calls += 1
        await asyncio.sleep(0)
        if self.fail_generate_at == call:
            raise RuntimeError("rollout service at local: Generate failed: UNAVAILABLE: engine died")
        out = []
        for q in reversed(questions):  # any order: the runner puts them back in question order
            text, reason = self.script(q, adapter)
            out.append(Answer(q.index, text, reason, self.stamp or adapter))  # type: ignore[arg-type]
        return out

    async def score(self, function: str, items: Sequence[ScoreInput]) -> list[Score]:
        results = [score(function, i.completion, i.ground_truth) for i in items]
        return [Score.of(r) for r in results]

    async def rewards(self, names: Collection[str] = ()) -> Catalog:
        return load_registry().catalog()


def request(benchmark: str = "rlvr-math-pairs-heldout", limit: int = 12, **kw) -> B.RunEvaluationRequest:
    return B.RunEvaluationRequest(benchmark=benchmark, limit=limit, **kw)


async def finished(manager: EvaluationManager, evaluation_id: str) -> B.Evaluation:
    await asyncio.wait_for(manager.wait_idle(), 30)
    return await manager.get(evaluation_id)


async def test_runner_stores_every_row_and_tallies(sqlite_store: Store) -> None:
    questions = [Question(i, (("user", f"q{i}"),), str(i)) for i in range(10)]
    sqlite_store.add_evaluation(EvaluationRow(id="e1", n_questions=10))
    seen = []

    async def progress(p) -> None:
        seen.append((p.done, p.total))

    peers = LocalPeers()
    result = await run_questions("e1", questions, "math_pairs", Sampling(), AdapterTag(), peers, peers, sqlite_store,
                                 batch_size=4, on_progress=progress)
    rows = sqlite_store.question_results("e1")
    assert [r.index for r in rows] == list(range(10)) and seen == [(4, 10), (8, 10), (10, 10)]
    assert [r.finish_reason for r in rows].count("LENGTH") == 3 and rows[2].completion.startswith("<think>1+1")
    t = result.tally
    # right on 0, 6 (in the whole format), on 4 (inside <answer>, without <think>: strict all the same,
    # strict is about how the answer is written, not the format) and on 2, whose cut-off reasoning
    # happens to end in its answer (correct as a value, not strict: its last line is not the answer)
    assert (t.n, t.correct, t.strict, t.formatted, t.answered) == (10, 4, 3, 2, 7)
    assert rows[4].strict and rows[4].accuracy == 1 and rows[4].format == 0 and rows[4].extracted_answer == "4"
    assert rows[2].accuracy == 1 and not rows[2].strict
    assert all(r.strict <= r.accuracy for r in rows)  # on every stored row
    assert t.share("accuracy_strict") <= t.share("accuracy") and t.share("answered") == 0.7
    assert t == tally((r.accuracy, r.strict, r.format, r.finish_reason == "STOP") for r in rows)
    assert rows[0].prompt == "q0" and rows[0].extracted_answer == "0" and rows[0].strict


async def test_loose_answers_count_for_accuracy_not_strict(sqlite_store: Store) -> None:
    peers = LocalPeers(script=lambda q, a: (f"the answer is {q.ground_truth}", "STOP"))
    manager = EvaluationManager(sqlite_store, peers)
    ev = await finished(manager, (await manager.run(request(limit=8))).id)
    assert (ev.scores.accuracy, ev.scores.accuracy_strict, ev.scores.format, ev.scores.answered) == (1.0, 0.0, 0.0, 1.0)


async def test_the_specs_70_70_0_evaluation(sqlite_store: Store) -> None:
    """The spec's evaluation example, accuracy 70%, accuracy strict 70%, format 0%: a model that
    answers on its last line without the think/answer wrapper, right on 7 questions of 10."""
    def bare(q: Question, a: AdapterTag) -> tuple[str, str]:
        answer = q.ground_truth if q.index % 10 < 7 else str(int(q.ground_truth) + 1)
        return f"adding the pairs and multiplying\n{answer}", "STOP"

    manager = EvaluationManager(sqlite_store, LocalPeers(script=bare))
    ev = await finished(manager, (await manager.run(request(limit=10))).id)
    assert (ev.scores.accuracy, ev.scores.accuracy_strict, ev.scores.format, ev.scores.answered) == (0.7, 0.7, 0.0, 1.0)
    rows = sqlite_store.question_results(ev.id)  # the Detailed Results rows say the same as the tiles
    assert sum(r.strict for r in rows) == 7 and all(r.strict <= r.accuracy and r.format == 0 for r in rows)


async def test_lifecycle_events_and_watch(sqlite_store: Store) -> None:
    events = MemoryEvents()
    manager = EvaluationManager(sqlite_store, LocalPeers(), events, batch_size=5, poll_seconds=0.2)
    queued = await manager.run(request(limit=12, label="round 1"))
    assert queued.status == B.EVALUATION_STATUS_QUEUED and queued.questions_total == 12
    watched = [e async for e in manager.watch(queued.id)]
    assert watched[-1].status == B.EVALUATION_STATUS_COMPLETED
    done = [e.questions_done for e in watched]
    assert done == sorted(done) and done[-1] == 12
    history = events.history[queued.id]
    assert [B.EvaluationStatus.Name(e.status)[18:] for e in history][:2] == ["QUEUED", "RUNNING"]
    assert [e.questions_done for e in history if e.status == B.EVALUATION_STATUS_RUNNING][1:] == [5, 10, 12]
    ev = await manager.get(queued.id)
    assert ev.label == "round 1" and ev.sampling.max_tokens == 256 and ev.sampling.temperature == 0
    assert ev.started_at.seconds and ev.finished_at.ToDatetime() >= ev.started_at.ToDatetime()
    assert ev.scores.score == ev.scores.accuracy and ev.scores.score_column == "accuracy"
    # A finished evaluation's watch is its final state at once.
    again = [e async for e in manager.watch(queued.id)]
    assert len(again) == 1 and again[0].status == B.EVALUATION_STATUS_COMPLETED


async def test_results_filter_and_paging(sqlite_store: Store) -> None:
    manager = EvaluationManager(sqlite_store, LocalPeers())
    ev = await finished(manager, (await manager.run(request(limit=12))).id)
    everything = await manager.results(ev.id, False, 0, 0)
    wrong = await manager.results(ev.id, True, 0, 0)
    assert everything.total == 12 and len(everything.results) == 12
    assert wrong.total == 12 - round(ev.scores.accuracy * 12) and all(r.accuracy < 1 for r in wrong.results)
    page = await manager.results(ev.id, True, 2, 3)
    assert [r.index for r in page.results] == [r.index for r in wrong.results][2:5] and page.total == wrong.total
    lengths = [r for r in everything.results if r.finish_reason == C.FINISH_REASON_LENGTH]
    assert len(lengths) == 4 and ev.scores.answered == pytest.approx(8 / 12)
    with pytest.raises(NotFound):
        await manager.results("nope", False, 0, 0)


async def test_leaderboard_best_first_ties_to_the_earlier(sqlite_store: Store) -> None:
    always = LocalPeers(script=lambda q, a: (f"<think>x</think><answer>{q.ground_truth}</answer>", "STOP"))
    manager = EvaluationManager(sqlite_store, always)
    best = await finished(manager, (await manager.run(request(limit=6, label="best"))).id)
    tied = await finished(manager, (await manager.run(request(limit=6, label="tied"))).id)
    manager.peers = LocalPeers()
    worse = await finished(manager, (await manager.run(request(limit=6, label="worse"))).id)
    await finished(manager, (await manager.run(request("gsm8k", limit=3))).id)
    board = await manager.leaderboard("rlvr-math-pairs-heldout", "", 0)
    assert board.score_column == "accuracy" and len(board.question_sets) == 1  # the same 6 questions
    assert [e.evaluation_id for e in board.entries] == [best.id, tied.id, worse.id]
    assert [e.rank for e in board.entries] == [1, 2, 3] and board.entries[0].label == "best"
    by_answered = await manager.leaderboard("rlvr-math-pairs-heldout", "answered", 2)
    assert [e.evaluation_id for e in by_answered.entries] == [best.id, tied.id]
    listed = await manager.list("gsm8k", 0)
    assert len(listed.evaluations) == 1 and listed.evaluations[0].benchmark == "gsm8k" and listed.total == 1
    everything = await manager.list("", 0)
    assert len(everything.evaluations) == 4 and everything.total == 4
    with pytest.raises(ValueError, match="score_column"):
        await manager.leaderboard("rlvr-math-pairs-heldout", "speed", 0)


async def test_the_leaderboard_ranks_only_evaluations_over_the_same_questions(sqlite_store: Store) -> None:
    """A 50-question evaluation at 22.0% is not ranked above 32-question ones at 21.9%: each question
    set is ranked on its own (the most questions first), every entry with its n and the standard
    error of its score; evaluations over the same questions share a set whatever their label."""
    from rlvr.services.benchmark.planning import question_set_id

    always = LocalPeers(script=lambda q, a: (f"<think>x</think><answer>{q.ground_truth}</answer>", "STOP"))
    manager = EvaluationManager(sqlite_store, always)
    small_best = await finished(manager, (await manager.run(request(limit=4, label="small best"))).id)
    manager.peers = LocalPeers()
    big = await finished(manager, (await manager.run(request(limit=10, label="big"))).id)
    small_worse = await finished(manager, (await manager.run(request(limit=4, label="small worse"))).id)
    assert small_best.question_set == small_worse.question_set != big.question_set
    assert small_best.question_set.startswith("qs-") and len(small_best.question_set) == 15
    board = await manager.leaderboard("rlvr-math-pairs-heldout", "", 0)
    assert [(q.id, q.questions, q.entries, q.description) for q in board.question_sets] == [
        (big.question_set, 10, 1, "the first 10 of 500 questions"),
        (small_best.question_set, 4, 2, "the first 4 of 500 questions")]
    assert [(e.evaluation_id, e.rank, e.questions, e.question_set) for e in board.entries] == [
        (big.id, 1, 10, big.question_set), (small_best.id, 1, 4, small_best.question_set),
        (small_worse.id, 2, 4, small_best.question_set)]
    p = big.scores.accuracy
    assert board.entries[0].standard_error == pytest.approx((p * (1 - p) / 10) ** 0.5)
    assert board.entries[1].standard_error == 0.0  # 4 of 4 right: p = 1
    only = await manager.leaderboard("rlvr-math-pairs-heldout", "", 0, small_best.question_set)
    assert [e.evaluation_id for e in only.entries] == [small_best.id, small_worse.id] and len(only.question_sets) == 1
    # The fingerprint is the questions': the same problems give the same id, others another.
    problems = await LocalPeers().problems("math_pairs", 4, "", "")
    assert question_set_id("rlvr-math-pairs-heldout", problems) == small_best.question_set
    assert question_set_id("rlvr-math-pairs-heldout", problems[:3]) != small_best.question_set
    # An evaluation stored before question sets were recorded ranks among those of its size alone.
    sqlite_store.update_evaluation(big.id, sampling_json="{}")
    legacy = await manager.leaderboard("rlvr-math-pairs-heldout", "", 0)
    assert legacy.question_sets[0].id == "n10" and "was not recorded" in legacy.question_sets[0].description


async def test_bad_requests_refused_before_generation(sqlite_store: Store, tmp_path: Path,
                                                      checkout_entry_points) -> None:
    (tmp_path / "no_columns.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    outside = tmp_path.parent / "elsewhere"
    peers = LocalPeers(adapters={"job-1": 3}, data_roots=[tmp_path])
    manager = EvaluationManager(sqlite_store, peers, adapter_roots=[tmp_path / "adapters"])
    cases = [
        (request("mmlu"), InvalidArgument, "benchmark: 'mmlu'"),
        (request(limit=501), InvalidArgument, "limit: 501"),
        (request(limit=-1), InvalidArgument, "limit: -1"),
        (request(sampling=C.SamplingParams(temperature=3)), InvalidArgument, "sampling.temperature"),
        (request(sampling=C.SamplingParams(max_tokens=8)), InvalidArgument, "sampling.max_tokens"),
        (request(sampling=C.SamplingParams(max_tokens=600)), InvalidArgument, "max_model_len 512"),
        (request(dataset="x.jsonl"), InvalidArgument, "only a benchmark that takes a dataset does (boxed, code-heldout, reasoning_gym)"),
        (request("boxed"), InvalidArgument, "dataset: required"),
        (request("boxed", dataset=str(tmp_path / "no_columns.jsonl")), InvalidArgument, "'prompt'"),
        (request(adapter=C.AdapterSelector(name="nobody")), NotFound, "job-1 v3"),
        (request(adapter=C.AdapterSelector(name="job-1", version=2)), NotFound, "live version is 3"),
        (request(adapter=C.AdapterSelector(name="../evil")), InvalidArgument, "adapter.name"),
        (request(adapter=C.AdapterSelector(version=2)), InvalidArgument, "adapter.version"),
        (request(adapter_path=str(outside)), InvalidArgument, "adapter.name: required"),
        (request(adapter=C.AdapterSelector(name="a"), adapter_path=str(outside)), InvalidArgument, "outside"),
        (request(model="another/model"), FailedPrecondition, "tiny-local"),
    ]
    for req, kind, text in cases:
        with pytest.raises(kind) as err:
            await manager.run(req)
        assert text in str(err.value), (text, str(err.value))
    assert peers.generate_calls == 0 and sqlite_store.list_evaluations() == [] and peers.uploads == []


async def test_adapter_path_uploads_the_next_version(sqlite_store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "adapters" / "round-2"
    folder.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (folder / name).write_text("{}")
    peers = LocalPeers(adapters={"loop": 4})
    manager = EvaluationManager(sqlite_store, peers, adapter_roots=[tmp_path / "adapters"])
    ev = await manager.run(request(limit=3, adapter=C.AdapterSelector(name="loop"), adapter_path=str(folder)))
    assert peers.uploads == [("loop", 5, folder.resolve())] and (ev.adapter_name, ev.adapter_version) == ("loop", 5)
    with pytest.raises(FailedPrecondition, match="not newer"):
        await manager.run(request(limit=3, adapter=C.AdapterSelector(name="loop", version=5), adapter_path=str(folder)))
    assert (await finished(manager, ev.id)).status == B.EVALUATION_STATUS_COMPLETED


async def test_a_head_s_adapter_is_refused_as_the_model_evaluated(sqlite_store: Store, tmp_path: Path) -> None:
    """A Head job's adapter scores text, it does not generate: refused before anything is uploaded,
    naming its benchmark (the head as a reward); the same folder without the head's description uploads."""
    import torch
    from safetensors.torch import save_file

    from rlvr.heads import HeadInfo, stamp_head

    folder = tmp_path / "artifacts" / "jobs" / "0a1b-2c" / "adapter"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(folder / "adapter_model.safetensors"))
    peers = LocalPeers(adapters={"loop": 4})
    manager = EvaluationManager(sqlite_store, peers, adapter_roots=[tmp_path / "artifacts"])
    stamp_head(folder, HeadInfo(task="classification", classes=("no", "yes"), reward_label="yes", base_model="m"))
    with pytest.raises(InvalidArgument, match=r"is a Head job's adapter \(a classification head on m\).*"
                                              r"the benchmark head_0a1b_2c on a dataset$"):
        await manager.run(request(limit=3, adapter=C.AdapterSelector(name="loop"), adapter_path=str(folder)))
    assert peers.uploads == []
    save_file({"w": torch.zeros(2)}, str(folder / "adapter_model.safetensors"))  # a policy's adapter
    await manager.run(request(limit=3, adapter=C.AdapterSelector(name="loop"), adapter_path=str(folder)))
    assert [u[:2] for u in peers.uploads] == [("loop", 5)]


@pytest.mark.parametrize("fault, cause", [
    ("generate", "Generate failed: UNAVAILABLE: engine died"),
    ("stamp", "answered by other v9, expected the base model"),
])
async def test_a_peer_failure_fails_the_evaluation_with_its_cause(sqlite_store: Store, fault: str, cause: str) -> None:
    peers = LocalPeers(fail_generate_at=1 if fault == "generate" else None,
                       stamp=AdapterTag("other", 9) if fault == "stamp" else None)
    manager = EvaluationManager(sqlite_store, peers, MemoryEvents(), batch_size=4, poll_seconds=0.2)
    ev = await manager.run(request(limit=12))
    events = [e async for e in manager.watch(ev.id)]
    failed = await manager.get(ev.id)
    assert failed.status == B.EVALUATION_STATUS_FAILED and cause in failed.error and "\n" not in failed.error
    assert events[-1].status == B.EVALUATION_STATUS_FAILED and cause in events[-1].message
    stored = len(sqlite_store.question_results(ev.id))
    assert stored == (4 if fault == "generate" else 0) and failed.questions_done == stored


async def test_interrupted_evaluations_fail_on_stop_and_on_restart(sqlite_store: Store) -> None:
    slow = LocalPeers()
    original = slow.generate

    async def stall(*args, **kw):
        await asyncio.sleep(3600)
        return await original(*args, **kw)

    slow.generate = stall  # type: ignore[method-assign]
    manager = EvaluationManager(sqlite_store, slow)
    ev = await manager.run(request(limit=3))
    await asyncio.sleep(0.1)
    await manager.stop()
    assert (await manager.get(ev.id)).error == INTERRUPTED
    left = sqlite_store.add_evaluation(EvaluationRow(benchmark="gsm8k", status="RUNNING", n_questions=5))
    await EvaluationManager(sqlite_store, LocalPeers()).start()
    row = sqlite_store.get_evaluation(left.id)
    assert row is not None and row.status == "FAILED" and row.error == INTERRUPTED and row.finished_at


def test_catalog(checkout_entry_points) -> None:
    infos = {b.name: b for b in EvaluationManager.benchmarks()}
    # every built-in reward makes one (the registry), named by the reward's default_benchmark
    assert set(infos) == set(benchmarks_of()) == {"rlvr-math-pairs-heldout", "gsm8k", "boxed", "code-heldout",
                                                          "guess-number", "reasoning_gym"}
    assert {b.name: b.reward_key for b in infos.values()} == {"rlvr-math-pairs-heldout": "math_pairs",
                                                              "gsm8k": "gsm8k", "boxed": "boxed",
                                                              "code-heldout": "code", "guess-number": "guess_number",
                                                              "reasoning_gym": "reasoning_gym"}
    assert infos["rlvr-math-pairs-heldout"].size == 500 and infos["rlvr-math-pairs-heldout"].display_name == \
        "RLVR Math Pairs held-out"
    assert infos["gsm8k"].size == len(get_task("gsm8k").prompts(split="test")) > 1000
    assert infos["boxed"].size == 0 and infos["boxed"].needs_dataset
    assert infos["reasoning_gym"].size == 200 and infos["reasoning_gym"].needs_dataset  # a task name as dataset
    assert all(list(b.score_columns) == ["accuracy", "accuracy_strict", "format", "answered"] for b in infos.values())


async def test_a_caller_gone_mid_run_leaves_no_evaluation_stranded(sqlite_store: Store) -> None:
    """gRPC cancels RunEvaluation's handler when the caller goes away (a scheduler killed while it
    starts a loop's evaluation). An evaluation stored by then still runs to its end: the caller's
    successor finds it by its label and waits on it, so one left QUEUED would be waited on forever."""
    stored = sqlite_store.add_evaluation

    def slow_insert(row: EvaluationRow) -> EvaluationRow:
        import time

        time.sleep(0.5)  # the caller goes away while the row is being written
        return stored(row)

    sqlite_store.add_evaluation = slow_insert  # type: ignore[method-assign]
    manager = EvaluationManager(sqlite_store, LocalPeers())
    call = asyncio.create_task(manager.run(request(limit=6, label="R2 (loop x)")))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(300):
        rows = sqlite_store.list_evaluations(None, 10)
        if rows and rows[0].status not in ("QUEUED", "RUNNING"):
            break
        await asyncio.sleep(0.1)
    assert [(r.status, r.n_done) for r in rows] == [("COMPLETED", 6)]


async def test_list_pages_and_delete_removes_a_finished_evaluation(sqlite_store: Store) -> None:
    manager = EvaluationManager(sqlite_store, LocalPeers())
    ids = [(await manager.run(request(limit=3, label=f"e{i}"))).id for i in range(3)]
    for evaluation_id in ids:
        await finished(manager, evaluation_id)
    first, second = await manager.list("", 2, 0), await manager.list("", 2, 2)
    assert first.total == second.total == 3 and len(first.evaluations) == 2 and len(second.evaluations) == 1
    assert {e.id for e in [*first.evaluations, *second.evaluations]} == set(ids)
    for limit, offset, name in ((-1, 0, "limit"), (501, 0, "limit"), (0, -1, "offset")):
        with pytest.raises(ValueError, match=f"^{name}: "):
            await manager.list("", limit, offset)

    gone = await manager.delete(ids[0])
    assert gone.id == ids[0] and gone.results_deleted == 3
    assert sqlite_store.get_evaluation(ids[0]) is None and sqlite_store.question_results(ids[0]) == []
    assert len(sqlite_store.question_results(ids[1])) == 3  # the others keep theirs
    with pytest.raises(NotFound):
        await manager.get(ids[0])
    with pytest.raises(NotFound):  # a second delete: the evaluation is unknown now
        await manager.delete(ids[0])
    assert (await manager.list("", 0)).total == 2

    running = sqlite_store.add_evaluation(EvaluationRow(benchmark="gsm8k", status="RUNNING"))
    with pytest.raises(FailedPrecondition, match="RUNNING"):
        await manager.delete(running.id)
    assert sqlite_store.get_evaluation(running.id) is not None


async def test_cancel_stops_a_running_evaluation_and_a_queued_one_never_starts(sqlite_store: Store) -> None:
    """CancelEvaluation in the core, one slot: the running evaluation's generation in flight is
    abandoned and it ends CANCELLED at once with the batch already stored; the queued one ends
    CANCELLED without starting; the next in the queue then runs. Cancel again answers the same; a
    completed one is refused naming its status, an unknown id is NOT_FOUND; a cancelled one deletes."""
    import time

    peers = LocalPeers()
    answer = peers.generate
    abandoned: list[int] = []

    async def runaway_after_first_batch(questions: Sequence[Question], sampling: Sampling,
                                        adapter: AdapterTag) -> list[Answer]:
        if questions[0].index >= 4:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                abandoned.append(questions[0].index)
                raise
        return await answer(questions, sampling, adapter)

    peers.generate = runaway_after_first_batch  # type: ignore[method-assign]
    events = MemoryEvents()
    manager = EvaluationManager(sqlite_store, peers, events, batch_size=4, max_concurrent=1, poll_seconds=0.2)
    running = await manager.run(request(limit=12))
    queued = await manager.run(request(limit=4))
    after = await manager.run(request(limit=4))
    for _ in range(200):
        if (await manager.get(running.id)).questions_done == 4:
            break
        await asyncio.sleep(0.02)

    never = await manager.cancel(queued.id)
    assert never.status == B.EVALUATION_STATUS_CANCELLED and never.questions_done == 0
    assert not never.started_at.seconds and never.finished_at.seconds and never.error == ""
    t0 = time.monotonic()
    stopped = await manager.cancel(running.id)
    assert time.monotonic() - t0 < 2 and abandoned == [4]
    assert stopped.status == B.EVALUATION_STATUS_CANCELLED and stopped.questions_done == 4
    assert len(sqlite_store.question_results(running.id)) == 4 and stopped.scores.score_column == "accuracy"
    assert await manager.cancel(running.id) == stopped  # idempotent

    done = await finished(manager, after.id)  # the queue moved on
    assert done.status == B.EVALUATION_STATUS_COMPLETED and done.questions_done == 4
    assert sqlite_store.question_results(queued.id) == []
    with pytest.raises(FailedPrecondition, match=rf"^evaluation {after.id} has already ended \(COMPLETED\); "
                                                 "only a QUEUED or RUNNING evaluation can be cancelled$"):
        await manager.cancel(after.id)
    with pytest.raises(NotFound, match="nope"):
        await manager.cancel("nope")
    with pytest.raises(InvalidArgument, match="^id: required"):
        await manager.cancel("")

    final = events.history[running.id][-1]
    assert final.status == B.EVALUATION_STATUS_CANCELLED and final.questions_done == 4
    assert final.message == "cancelled by request after 4 of 12 questions"
    assert events.history[queued.id][-1].message == "cancelled by request after 0 of 4 questions"
    assert [e.status async for e in manager.watch(running.id)] == [B.EVALUATION_STATUS_CANCELLED]
    assert (await manager.delete(running.id)).results_deleted == 4
