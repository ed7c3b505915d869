"""In-memory twins of the scheduler and benchmark clients the web console calls, for
tests/test_web_app.py (and `python tests/web_fakes.py PORT`, the console over these fakes for a
look in a browser).

The fake scheduler validates with the scheduler's own rules (rlvr/jobspec/ and
loopspec.py) and answers their errors as the real one does (INVALID_ARGUMENT with the message), so
the console's range probing and error placement are tested against the real validation.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).parent))

from test_jobs_view import RISING, make_metrics  # noqa: E402
from test_loops_view import make_loop, running_loop  # noqa: E402

from rlvr.common.errors import InvalidArgument  # noqa: E402
from rlvr.jobspec import resolve_spec  # noqa: E402
from rlvr.peers.base import RlvrError  # noqa: E402
from rlvr.peers.types import catalog_proto  # noqa: E402
from rlvr.rewards.registry import load_registry  # noqa: E402
from rlvr.services.benchmark.catalog import SCORE_COLUMNS, benchmarks_of  # noqa: E402
from rlvr.services.scheduler.loopspec import resolve_loop_spec  # noqa: E402
from rlvr.v1 import benchmark_pb2 as B  # noqa: E402
from rlvr.v1 import common_pb2 as C  # noqa: E402
from rlvr.v1 import reward_pb2 as R  # noqa: E402
from rlvr.v1 import scheduler_pb2 as S  # noqa: E402

BENCHMARK_INFOS = [B.BenchmarkInfo(name=b.name, display_name=b.display_name, size=b.size,
                                   score_columns=list(SCORE_COLUMNS), default_score_column=b.default_score_column,
                                   needs_dataset=b.needs_dataset, reward_key=b.reward_function)
                   for b in benchmarks_of().values()]


def invalid(e: InvalidArgument) -> RlvrError:
    return RlvrError(grpc.StatusCode.INVALID_ARGUMENT, str(e), "rlvr.v1.SchedulerService/CreateJob",
                     violations=e.violations)


def not_found(what: str) -> RlvrError:
    return RlvrError(grpc.StatusCode.NOT_FOUND, f"{what} not found", "rlvr.v1.SchedulerService/Get")


class FakeScheduler:
    def __init__(self) -> None:
        self.ids = (f"job{i:04d}" for i in itertools.count(1))
        self.jobs: dict[str, C.Job] = {}
        self.metrics: dict[str, S.JobMetrics] = {}
        self.loops: dict[str, S.Loop] = {}
        self.calls: list[str] = []
        self.closed = 0
        self.samples: dict[str, list[C.CompletionSamples]] = {}  # by job, oldest step first
        self.model_roots: list[Path] = []  # ListModels: the bundled models alone
        done = self.add_job("rising", C.JOB_STATUS_COMPLETED, RISING)
        done.adapter.name, done.adapter.version = f"job-{done.id}", 12
        for step in range(1, len(RISING) + 1):
            event = C.CompletionSamples(job_id=done.id, step=step)
            for i in range(2):
                event.samples.add(prompt=f"<|system|>\nReason, then answer.\n<|user|>\nAdd {step} and {i}",
                                  completion=f"<think>{step}+{i}</think><answer>{step + i}</answer>",
                                  reward=1.0 if i else 0.5, accuracy=float(i))
            self.samples.setdefault(done.id, []).append(event)
        self.add_job("queued", C.JOB_STATUS_QUEUED, [])
        for loop in (make_loop(), running_loop()):
            self.loops[loop.id] = loop

    def add_job(self, name: str, status: int, accuracy: list[float]) -> C.Job:
        resolved = resolve_spec(C.JobSpec(name=name))
        job = C.Job(id=next(self.ids), spec=resolved.spec, status=status, summary=resolved.summary,
                    current_step=len(accuracy), total_steps=max(len(accuracy), 100))
        job.created_at.FromSeconds(1_700_000_000)
        self.jobs[job.id] = job
        metrics = make_metrics(accuracy, job_id=job.id)
        metrics.status = status
        self.metrics[job.id] = metrics
        return job

    def close(self) -> None:
        self.closed += 1

    # ------------------------------------------------------------ jobs

    def list_reward_functions(self, request: object = None, **_: object) -> R.ListRewardFunctionsResponse:
        return catalog_proto(load_registry().catalog())  # the scheduler passes the reward service's on

    def list_models(self, request: object = None, **_: object) -> S.ListModelsResponse:
        from rlvr.services.scheduler.models import models_proto

        return models_proto(self.model_roots)  # the scheduler's own answer, over these roots

    def create_job(self, request: S.CreateJobRequest, **_: object) -> S.CreateJobResponse:
        self.calls.append("CreateJob" + (" dry" if request.dry_run else ""))
        try:
            resolved = resolve_spec(request.spec, catalog=load_registry().catalog())
        except InvalidArgument as e:
            raise invalid(e) from None
        resp = S.CreateJobResponse(summary=resolved.summary, warnings=resolved.warnings,
                                   resolved_spec=resolved.spec)
        if not request.dry_run:
            job = C.Job(id=next(self.ids), spec=resolved.spec, status=C.JOB_STATUS_QUEUED,
                        summary=resolved.summary, warnings=resolved.warnings, total_steps=resolved.total_steps)
            self.jobs[job.id] = job
            self.metrics[job.id] = make_metrics([], job_id=job.id)
            resp.job.CopyFrom(job)
        return resp

    def get_job(self, request: S.GetJobRequest, **_: object) -> C.Job:
        if request.id not in self.jobs:
            raise not_found(f"job {request.id!r}")
        return self.jobs[request.id]

    def list_jobs(self, request: S.ListJobsRequest | None = None, **_: object) -> S.ListJobsResponse:
        jobs = list(reversed(self.jobs.values()))
        return S.ListJobsResponse(jobs=jobs, total=len(jobs))

    def get_job_metrics(self, request: S.GetJobMetricsRequest, **_: object) -> S.JobMetrics:
        self.get_job(S.GetJobRequest(id=request.job_id))
        return self.metrics[request.job_id]

    def get_job_samples(self, request: S.GetJobSamplesRequest, **_: object) -> S.GetJobSamplesResponse:
        """As the scheduler answers: one step, or the latest `limit` (0: 5), newest first."""
        job = self.get_job(S.GetJobRequest(id=request.job_id))
        kept = self.samples.get(job.id, [])
        steps = [e for e in kept if e.step == request.step] if request.step else \
            list(reversed(kept))[:request.limit or 5]
        return S.GetJobSamplesResponse(job_id=job.id, steps=steps, environment=job.spec.environment.key)

    def cancel_job(self, request: S.CancelJobRequest, **_: object) -> C.Job:
        self.calls.append(f"CancelJob {request.id}")
        job = self.get_job(S.GetJobRequest(id=request.id))
        job.status = C.JOB_STATUS_CANCELLED
        return job

    def delete_job(self, request: S.DeleteJobRequest, **_: object) -> S.DeleteJobResponse:
        self.calls.append(f"DeleteJob {request.id}")
        self.get_job(S.GetJobRequest(id=request.id))
        del self.jobs[request.id]
        return S.DeleteJobResponse(id=request.id)

    def watch_job(self, request: S.WatchJobRequest, **_: object) -> Iterator[C.JobEvent]:
        job = self.get_job(S.GetJobRequest(id=request.id))
        yield C.JobEvent(status=C.JobStatusEvent(job_id=job.id, status=job.status))

    def download_adapter(self, request: S.DownloadAdapterRequest, **_: object) -> Iterator[C.FileChunk]:
        job = self.get_job(S.GetJobRequest(id=request.job_id))
        if not job.adapter.name:
            raise RlvrError(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.id} has no adapter yet")
        yield C.FileChunk(path="adapter_config.json", data=b'{"r": 8}', file_size=8, last=True)
        yield C.FileChunk(path="adapter_model.safetensors", data=b"x" * 1000, file_size=2000)
        yield C.FileChunk(path="adapter_model.safetensors", offset=1000, data=b"y" * 1000, file_size=2000, last=True)

    def download_merged_model(self, request: S.DownloadMergedModelRequest, **_: object) -> Iterator[C.FileChunk]:
        self.calls.append(f"DownloadMergedModel {request.job_id}" + (f" {request.dtype}" if request.dtype else ""))
        yield C.FileChunk(path="config.json", data=b"{}", file_size=2, last=True)

    def merge_model(self, request: S.MergeModelRequest, **_: object) -> Iterator[S.MergeModelProgress]:
        self.calls.append(f"MergeModel {request.job_id}" + (f" {request.dtype}" if request.dtype else ""))
        yield S.MergeModelProgress(stage="loading", fraction=0.2)
        yield S.MergeModelProgress(stage="merging", fraction=0.6)
        yield S.MergeModelProgress(stage="done", fraction=1.0, done=True, path="/srv/merged/x", size_bytes=2048)

    def merge(self, job_id: str, dtype: str = "", **_: object) -> S.MergeModelProgress:
        return list(self.merge_model(S.MergeModelRequest(job_id=job_id, dtype=dtype)))[-1]

    def export_history(self, request: S.ExportHistoryRequest, **_: object) -> S.ExportHistoryResponse:
        self.get_job(S.GetJobRequest(id=request.job_id))
        jsonl = request.format == S.EXPORT_FORMAT_JSONL
        content = b'{"step": 1, "reward_mean": 0.5}\n' if jsonl else b"step,reward_mean\n1,0.5\n"
        return S.ExportHistoryResponse(content=content, rows=1, filename=f"job-{request.job_id}.{'jsonl' if jsonl else 'csv'}",
                                       content_type="application/x-ndjson" if jsonl else "text/csv")

    # ------------------------------------------------------------ loops

    def create_loop(self, request: S.CreateLoopRequest, **_: object) -> S.CreateLoopResponse:
        self.calls.append("CreateLoop" + (" dry" if request.dry_run else ""))
        try:
            resolved = resolve_loop_spec(request.spec, BENCHMARK_INFOS, 64)
        except InvalidArgument as e:
            raise invalid(e) from None
        resp = S.CreateLoopResponse(resolved_spec=resolved.spec, summary=resolved.job.summary,
                                    warnings=resolved.warnings)
        if not request.dry_run:
            loop = S.Loop(id=f"loop{len(self.loops) + 1:04d}", spec=resolved.spec, status=S.LOOP_STATUS_QUEUED,
                          summary=resolved.job.summary)
            self.loops[loop.id] = loop
            resp.loop.CopyFrom(loop)
        return resp

    def get_loop(self, request: S.GetLoopRequest, **_: object) -> S.Loop:
        if request.id not in self.loops:
            raise not_found(f"loop {request.id!r}")
        return self.loops[request.id]

    def list_loops(self, request: S.ListLoopsRequest | None = None, **_: object) -> S.ListLoopsResponse:
        return S.ListLoopsResponse(loops=list(self.loops.values()), total=len(self.loops))

    def stop_loop(self, request: S.StopLoopRequest, **_: object) -> S.Loop:
        self.calls.append(f"StopLoop {request.id}")
        loop = self.get_loop(S.GetLoopRequest(id=request.id))
        loop.status = S.LOOP_STATUS_STOPPED
        return loop

    def watch_loop(self, request: S.WatchLoopRequest, **_: object) -> Iterator[S.Loop]:
        loop = S.Loop()
        loop.CopyFrom(self.get_loop(S.GetLoopRequest(id=request.id)))
        yield loop
        final = S.Loop()
        final.CopyFrom(loop)
        final.status = S.LOOP_STATUS_STOPPED
        yield final


class FakeBenchmark:
    def __init__(self) -> None:
        self.evaluation = B.Evaluation(id="ev1", model="rlvr-tiny", benchmark="rlvr-math-pairs-heldout",
                                       status=B.EVALUATION_STATUS_COMPLETED, questions_total=45, questions_done=45,
                                       label="math-pairs to 70% R1 (loop 3f9c1a2b4d5e)", adapter_name="job-x",
                                       adapter_version=3, question_set="qs-0123456789ab")
        self.evaluation.scores.CopyFrom(B.ScoreBreakdown(score=0.2, accuracy=0.2, accuracy_strict=0.2, format=1.0,
                                                         answered=1.0, score_column="accuracy"))
        self.results = [B.QuestionResult(index=i, prompt=f"Add the pairs of {i} <and> {i + 1}", ground_truth=str(i),
                                         completion=f"<think>{i}</think><answer>{i if i % 5 == 0 else i + 1}</answer>",
                                         extracted_answer=str(i if i % 5 == 0 else i + 1),
                                         accuracy=1.0 if i % 5 == 0 else 0.0, format=1.0, strict=i % 5 == 0,
                                         finish_reason=C.FINISH_REASON_STOP) for i in range(45)]
        self.others: dict[str, tuple[B.Evaluation, list[B.QuestionResult]]] = {}  # more evaluations, by id
        self.calls: list[str] = []

    def _stored(self, evaluation_id: str) -> tuple[B.Evaluation, list[B.QuestionResult]]:
        if evaluation_id == self.evaluation.id:
            return self.evaluation, self.results
        if evaluation_id in self.others:
            return self.others[evaluation_id]
        raise RlvrError(grpc.StatusCode.NOT_FOUND, f"evaluation {evaluation_id!r} not found",
                        "rlvr.v1.BenchmarkService/GetEvaluation")

    def list_benchmarks(self, request: object = None, **_: object) -> B.ListBenchmarksResponse:
        return B.ListBenchmarksResponse(benchmarks=BENCHMARK_INFOS)

    def list_evaluations(self, request: B.ListEvaluationsRequest | None = None, **_: object) -> B.ListEvaluationsResponse:
        return B.ListEvaluationsResponse(evaluations=[self.evaluation, *(e for e, _ in self.others.values())])

    def get_evaluation(self, request: B.GetEvaluationRequest, **_: object) -> B.Evaluation:
        return self._stored(request.id)[0]

    def cancel_evaluation(self, request: B.CancelEvaluationRequest, **_: object) -> B.Evaluation:
        """As the service answers: a queued or running one ends CANCELLED, a cancelled one is
        answered as it is, a completed or failed one is refused naming its status."""
        self.calls.append(f"CancelEvaluation {request.id}")
        evaluation = self._stored(request.id)[0]
        if evaluation.status in (B.EVALUATION_STATUS_COMPLETED, B.EVALUATION_STATUS_FAILED):
            status = B.EvaluationStatus.Name(evaluation.status).removeprefix("EVALUATION_STATUS_")
            raise RlvrError(grpc.StatusCode.FAILED_PRECONDITION,
                            f"evaluation {request.id} has already ended ({status}); only a QUEUED or RUNNING "
                            "evaluation can be cancelled", "rlvr.v1.BenchmarkService/CancelEvaluation")
        evaluation.status = B.EVALUATION_STATUS_CANCELLED
        return evaluation

    def get_evaluation_results(self, request: B.GetEvaluationResultsRequest, **_: object
                               ) -> B.GetEvaluationResultsResponse:
        rows = [r for r in self._stored(request.id)[1] if not request.only_wrong or r.accuracy < 1]
        page = rows[request.offset:request.offset + request.limit] if request.limit else rows[request.offset:]
        return B.GetEvaluationResultsResponse(results=page, total=len(rows))

    def get_leaderboard(self, request: B.GetLeaderboardRequest, **_: object) -> B.GetLeaderboardResponse:
        column = request.score_column or "accuracy"
        entries = [B.LeaderboardEntry(rank=1, evaluation_id="ev1", model="rlvr-tiny", adapter_name="job-x",
                                      adapter_version=3, scores=self.evaluation.scores, label="R1",
                                      question_set="qs-0123456789ab", questions=45, standard_error=0.0596),
                   B.LeaderboardEntry(rank=1, evaluation_id="ev2", model="rlvr-tiny", scores=B.ScoreBreakdown(
                       accuracy=0.25, accuracy_strict=0.25, format=1.0, answered=1.0), label="base, 32 questions",
                                      question_set="qs-ba9876543210", questions=32, standard_error=0.077)]
        sets = [B.QuestionSet(id="qs-0123456789ab", questions=45, entries=1, description="the first 45 of 500 questions"),
                B.QuestionSet(id="qs-ba9876543210", questions=32, entries=1, description="the first 32 of 500 questions")]
        return B.GetLeaderboardResponse(benchmark=request.benchmark, score_column=column, entries=entries,
                                        question_sets=sets)


class FakeSdk:
    def __init__(self) -> None:
        self.scheduler = FakeScheduler()
        self.benchmark = FakeBenchmark()


def app_over_fakes(sdk: FakeSdk | None = None, login: object = None, bind: str = ""):  # noqa: ANN201 (Starlette)
    from rlvr.clients.web.app import create_app

    sdk = sdk or FakeSdk()
    return create_app(sdk, stream_client=lambda: sdk.scheduler, secret=b"test-secret",
                      addresses={"scheduler": "fake:1", "benchmark": "fake:2"}, login=login, bind=bind)  # type: ignore[arg-type]


if __name__ == "__main__":  # the console over the fakes, to look at
    import uvicorn

    uvicorn.run(app_over_fakes(), host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 8050)
