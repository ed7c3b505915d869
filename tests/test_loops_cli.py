"""`rlvr loops ...` (clients/commands/loops.py) and the SDK's loop conveniences against a fake in-process
SchedulerService on loopback: parsing (rlvr train's flags plus the loop's, unset flags left unset),
the dry run, start, watch and its exit codes, list, show, stop, report, export, and the server's
errors as one line."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cli_fakes import run, serving
from test_loops_view import make_loop, running_loop

from rlvr.clients import cli
from rlvr.clients.commands import loops as loops_cmd
from rlvr.clients.sdk import RlvrError, SchedulerClient
from rlvr.clients.views import loops as V
from rlvr.common.errors import InvalidArgument
from rlvr.services.benchmark.evaluations import EvaluationManager
from rlvr.services.scheduler.loopspec import resolve_loop_spec
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S
from rlvr.v1 import scheduler_pb2_grpc

WARNING = "grpo.batch_size 4 rounded up to 8, a multiple of grpo.group_size 8"


class FakeScheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    """Validates and resolves with the scheduler's own code, and plays back loops."""

    def __init__(self) -> None:
        self.requests: list[S.CreateLoopRequest] = []
        self.loops: dict[str, S.Loop] = {"3f9c1a2b4d5e": make_loop()}
        # what WatchLoop plays for a new loop: running, then the final state
        self.final = make_loop()
        self.lock = threading.Lock()

    def _get(self, loop_id: str, context: grpc.ServicerContext) -> S.Loop:
        if loop_id not in self.loops:
            context.abort(grpc.StatusCode.NOT_FOUND, f"loop {loop_id!r} not found")
        return self.loops[loop_id]

    def CreateLoop(self, request, context):
        with self.lock:
            self.requests.append(request)
        try:  # the scheduler's own validation and defaults, against the benchmark service's catalog
            resolved = resolve_loop_spec(request.spec, EvaluationManager.benchmarks(), 64)
        except InvalidArgument as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        response = S.CreateLoopResponse(resolved_spec=resolved.spec, summary=resolved.job.summary,
                                        warnings=resolved.warnings)
        if not request.dry_run:
            loop = S.Loop()
            loop.CopyFrom(self.final)
            loop.id, loop.spec.name = "newloop00001", resolved.spec.name
            self.loops[loop.id] = loop
            running = running_loop()
            running.id = loop.id
            response.loop.CopyFrom(running)
        return response

    def GetLoop(self, request, context):
        return self._get(request.id, context)

    def ListLoops(self, request, context):
        loops = [loop for loop in self.loops.values() if not request.status or loop.status == request.status]
        return S.ListLoopsResponse(loops=loops[: request.limit or 100], total=len(loops))

    def StopLoop(self, request, context):
        loop = self._get(request.id, context)
        if V.is_final(loop.status):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"loop {request.id} has already ended ({V.status_word(loop.status)})")
        loop.status, loop.message = S.LOOP_STATUS_STOPPED, "stopped during round 4"
        loop.rounds[-1].status = S.ROUND_STATUS_STOPPED
        return loop

    def WatchLoop(self, request, context):
        final = self._get(request.id, context)
        for step in (10, 30):
            loop = running_loop()
            loop.id = request.id
            loop.rounds[-1].current_step = step
            yield loop
        yield loop  # an unchanged update prints no new line
        if request.id != "cut":
            yield final


@pytest.fixture
def scheduler() -> Iterator[tuple[str, FakeScheduler]]:
    fake = FakeScheduler()
    with serving(fake) as address:
        yield address, fake


# ---------------------------------------------------------------- parsing


def parse(*argv: str) -> S.LoopSpec:
    return loops_cmd.loop_spec_from_args(cli.build_parser().parse_args(["loops", "start", *argv]))


def test_start_takes_train_flags_and_leaves_unset_flags_unset() -> None:
    spec = parse("--target", "35", "--name", "math-pairs to 35%", "--rank", "16", "--max-steps", "50",
                 "--backend", "transformers", "--seed", "3")
    assert spec.name == "math-pairs to 35%" and spec.job.name == ""  # rounds are named "<loop name> R<k>"
    assert spec.job.grpo.lora_rank == 16 and spec.job.grpo.max_steps == 50 and spec.job.advanced.seed == 3
    assert spec.job.advanced.generation_backend == C.GENERATION_BACKEND_TRANSFORMERS
    assert not spec.job.grpo.HasField("group_size")  # like `rlvr train`: left to the server
    assert spec.target == 35.0 and spec.benchmark == "" and spec.score_column == ""  # the server's defaults
    for field in ("max_rounds", "give_up_after", "reclaim_storage", "min_gain"):
        assert not spec.HasField(field), field
    assert spec.benchmark_limit == 0 and spec.benchmark_dataset == "" and spec.benchmark_dataset_split == ""


def test_loop_flags() -> None:
    spec = parse("--target", "40.5%", "--benchmark", "boxed", "--score-column", "accuracy_strict", "--max-rounds", "3",
                 "--give-up-after", "1", "--no-reclaim-storage", "--benchmark-limit", "200", "--min-gain", "0.5",
                 "--benchmark-dataset", "data.jsonl", "--benchmark-split", "dev")
    assert (spec.target, spec.benchmark, spec.score_column) == (40.5, "boxed", "accuracy_strict")
    assert (spec.max_rounds, spec.give_up_after, spec.reclaim_storage) == (3, 1, False)
    assert (spec.benchmark_limit, spec.min_gain) == (200, 0.5)
    assert (spec.benchmark_dataset, spec.benchmark_dataset_split) == ("data.jsonl", "dev")
    assert spec.name == ""  # no --name: the scheduler names it "<benchmark> to <target>%"


def test_target_is_required_and_a_percent(capfd) -> None:
    code, _, err = run(capfd, "loops", "start")
    assert code == 2 and "--target" in err
    code, _, err = run(capfd, "loops", "start", "--target", "lots")
    assert code == 2 and "'lots' is not a percent" in err


def test_help_lists_the_loop_commands(capfd) -> None:
    code, out, _ = run(capfd, "loops", "--help")
    assert code == 0
    for command in ("start", "list", "show", "watch", "stop", "report", "export"):
        assert command in out
    code, out, _ = run(capfd, "loops", "start", "--help")
    assert code == 0 and "--give-up-after" in out and "--rank" in out and "0 target reached" in out


# ---------------------------------------------------------------- commands


def test_dry_run_prints_settings_beside_the_summary_and_creates_nothing(scheduler, capfd) -> None:
    address, fake = scheduler
    code, out, err = run(capfd, "loops", "start", "--dry-run", "--target", "35", "--name", "math-pairs to 35%",
                         "--address", address)
    assert code == 0, err
    assert fake.requests[-1].dry_run and len(fake.loops) == 1
    lines = out.splitlines()
    assert lines[0] == "Loop 'math-pairs to 35%'"
    assert any(line.startswith("Training Summary") and line.endswith("Loop Settings") for line in lines)
    assert any("Method" in line and "Benchmark     rlvr-math-pairs-heldout" in line for line in lines)
    assert "Score Column  accuracy" in out and "Max Rounds    8" in out  # the server's resolved defaults
    assert f"warning: {WARNING[:60]}" in out and max(len(line) for line in lines) <= 80
    assert lines[-1] == "dry run: the loop is valid; nothing was created"


def test_invalid_argument_is_one_line_and_exit_2(scheduler, capfd) -> None:
    address, _ = scheduler
    code, out, err = run(capfd, "loops", "start", "--target", "150", "--address", address)
    assert (code, out) == (2, "")
    assert err == ("error: INVALID_ARGUMENT: target: 150.0 is out of range; allowed: a percent in (0, 100], the "
                   "leaderboard's scale; required\n")


def test_start_detach_then_list_show_stop(scheduler, capfd) -> None:
    address, fake = scheduler
    code, out, err = run(capfd, "loops", "start", "--detach", "--target", "70", "--address", address)
    assert code == 0, err
    assert "loop newloop00001 started" in out and not fake.requests[-1].dry_run
    assert fake.requests[-1].spec.name == "" and fake.loops["newloop00001"].spec.name == "rlvr-math-pairs-heldout to 70%"

    code, out, _ = run(capfd, "loops", "list", "--address", address)
    assert code == 0 and out.splitlines()[0] == V.list_header()
    assert "3f9c1a2b4d5e  Target reached  7/8      70.0%" in out and out.endswith("2 loop(s)\n")
    code, out, _ = run(capfd, "loops", "list", "--limit", "1", "--status", "target_reached", "--address", address)
    assert code == 0 and out.endswith("1 of 2 loop(s)\n")

    code, out, err = run(capfd, "loops", "show", "3f9c1a2b4d5e", "--address", address)
    assert code == 0, err
    assert out.startswith(V.render(make_loop()))
    assert "Training Summary (each round)" in out and max(len(line) for line in out.splitlines()) <= 80

    fake.loops["run1"] = running_loop()
    code, out, err = run(capfd, "loops", "stop", "run1", "--address", address)
    assert code == 0, err
    assert out == ("loop 3f9c1a2b4d5e stopped: stopped during round 4\n"
                   "3 scored round(s) kept; best R2 41.5%, adapter job-job002abcdef v100\n")
    code, out, err = run(capfd, "loops", "stop", "run1", "--address", address)
    assert (code, out) == (1, "") and err == "error: FAILED_PRECONDITION: loop run1 has already ended (Stopped)\n"
    code, _, err = run(capfd, "loops", "show", "nosuch", "--address", address)
    assert code == 1 and err == "error: NOT_FOUND: loop 'nosuch' not found\n"


@pytest.mark.parametrize(("status", "expected"), [
    (S.LOOP_STATUS_TARGET_REACHED, 0), (S.LOOP_STATUS_ROUNDS_SPENT, 3), (S.LOOP_STATUS_PLATEAUED, 3),
    (S.LOOP_STATUS_STOPPED, 4), (S.LOOP_STATUS_FAILED, 1)])
def test_start_watches_until_the_end_and_exits_with_the_outcome(scheduler, capfd, status, expected) -> None:
    address, fake = scheduler
    fake.final = make_loop(status=status, message=f"ended: {V.status_word(status)}")
    code, out, err = run(capfd, "loops", "start", "--target", "70", "--address", address)
    assert code == expected, err
    progress = [line for line in out.splitlines() if line.startswith("Training  rounds 4/8")]
    assert ["R4 training step 10/100" in p for p in progress] == [True, False]  # one line per change
    assert ["R4 training step 30/100" in p for p in progress] == [False, True]
    assert f"ended: {V.status_word(status)}" in out and "Score per round" in out


def test_watch_that_ends_early_asks_again(scheduler, capfd) -> None:
    address, fake = scheduler
    fake.loops["cut"] = running_loop()
    code, _, err = run(capfd, "loops", "watch", "cut", "--address", address)
    assert code == 1 and "the watch ended before loop cut did" in err
    fake.loops["cut"] = make_loop(status=S.LOOP_STATUS_PLATEAUED)  # it ended meanwhile
    code, out, _ = run(capfd, "loops", "watch", "cut", "--address", address)
    assert code == 3


def test_report_writes_html_and_png(scheduler, capfd, tmp_path: Path) -> None:
    address, _ = scheduler
    code, out, err = run(capfd, "loops", "report", "3f9c1a2b4d5e", "-o", str(tmp_path / "r"), "--address", address)
    assert code == 0, err
    path = Path(out.strip())
    assert path == tmp_path / "r" / "report.html" and (tmp_path / "r" / "scores.png").is_file()
    assert "Target reached" in path.read_text(encoding="utf-8")


def test_export_to_stdout_file_and_folder(scheduler, capfd, tmp_path: Path) -> None:
    address, _ = scheduler
    code, out, _ = run(capfd, "loops", "export", "3f9c1a2b4d5e", "--address", address)
    assert code == 0 and out == V.export_text(make_loop(), "csv")
    assert [row["score"] for row in csv.DictReader(io.StringIO(out))] == ["34.0", "41.5", "40.0", "52.0", "58.5",
                                                                          "63.0", "70.0"]
    target = tmp_path / "rounds.jsonl"
    code, out, _ = run(capfd, "loops", "export", "3f9c1a2b4d5e", "--format", "jsonl", "-o", str(target),
                       "--address", address)
    assert code == 0 and f"to {target}" in out
    assert [json.loads(line) for line in target.read_text().splitlines()] == V.export_rows(make_loop())
    code, out, _ = run(capfd, "loops", "export", "3f9c1a2b4d5e", "-o", str(tmp_path), "--address", address)
    assert code == 0 and (tmp_path / "loop-3f9c1a2b4d5e-rounds.csv").is_file()
    code, _, err = run(capfd, "loops", "export", "3f9c1a2b4d5e", "--format", "xml")
    assert code == 2 and "invalid choice: 'xml'" in err


# ---------------------------------------------------------------- the SDK


def test_sdk_create_watch_and_export(scheduler, tmp_path: Path) -> None:
    address, _ = scheduler
    with SchedulerClient(address) as client:
        resp = client.create_loop(S.CreateLoopRequest(spec=S.LoopSpec(name="n", target=70), dry_run=True))
        assert isinstance(resp, S.CreateLoopResponse) and not resp.HasField("loop")
        assert resp.resolved_spec.max_rounds == 8 and list(resp.warnings) == [WARNING]
        updates = list(client.watch_loop_updates("3f9c1a2b4d5e"))
        assert [u.status for u in updates] == [S.LOOP_STATUS_TRAINING] * 3 + [S.LOOP_STATUS_TARGET_REACHED]
        path = client.export_loop("3f9c1a2b4d5e", "jsonl", tmp_path)
        assert path == tmp_path / "loop-3f9c1a2b4d5e-rounds.jsonl"
        assert [json.loads(line)["round"] for line in path.read_text().splitlines()] == list(range(1, 8))
        path = client.export_loop("3f9c1a2b4d5e", S.EXPORT_FORMAT_CSV, tmp_path / "sub" / "r.csv")
        assert path.read_text().startswith("round,status,job_id,")
        with pytest.raises(ValueError, match="csv, jsonl"):
            client.export_loop("3f9c1a2b4d5e", "xml")
        with pytest.raises(RlvrError) as e:
            client.export_loop("nosuch", "csv", tmp_path)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
