"""The `rlvr` CLI: the generated `call` commands against fake servicers on a loopback port (JSON
in and out, streams, errors, help for every RPC), the console entry, and the lazy hooks."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from rlvr.clients import cli
from rlvr.clients.commands.rpc import services
from rlvr.common.client import deadline_for
from rlvr.v1 import (
    common_pb2,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    scheduler_pb2_grpc,
)

ROOT = Path(__file__).resolve().parent.parent


class FakeReward(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self) -> None:
        self.deadline: float | None = None

    def Score(self, request, context):
        self.deadline = context.time_remaining()
        return reward_pb2.ScoreResponse(
            results=[
                common_pb2.RewardComponents(
                    reward=float(len(item.completion)), extracted_answer=item.ground_truth
                )
                for item in request.items
            ]
        )


class FakeRollout(rollout_pb2_grpc.RolloutServiceServicer):
    def Generate(self, request, context):
        for index, prompt in enumerate(request.prompts):
            completion = rollout_pb2.Completion(prompt_index=index, text=prompt.text[::-1], adapter_version=7)
            yield rollout_pb2.GenerateResponse(completions=[completion])

    def LoadAdapter(self, request_iterator, context):
        messages = list(request_iterator)
        size = sum(len(m.chunk.data) for m in messages if m.WhichOneof("part") == "chunk")
        header = messages[0].header
        return rollout_pb2.AdapterInfo(name=header.name, version=header.version, size_bytes=size)


class FakeScheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    def GetJob(self, request, context):
        context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.id!r} not found")


@pytest.fixture
def server() -> Iterator[tuple[str, FakeReward]]:
    reward = FakeReward()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(reward, grpc_server)
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(FakeRollout(), grpc_server)
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(FakeScheduler(), grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    yield f"127.0.0.1:{port}", reward
    grpc_server.stop(0)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


SCORE = '{"items": [{"completion": "abcd", "ground_truth": "42"}]}'


def test_unary_call_prints_json_with_proto_names_and_defaults(server, capsys) -> None:
    address, reward = server
    code, out, err = run(capsys, "call", "reward", "Score", SCORE, "--address", address)
    assert (code, err) == (0, "")
    result = json.loads(out)["results"][0]
    assert result["reward"] == 4.0 and result["extracted_answer"] == "42"
    assert result["timed_out"] is False and result["strict"] is False  # defaults are printed
    assert 0 < reward.deadline <= deadline_for("rlvr.v1.RewardService/Score") * 1.01


def test_request_from_option_file_and_stdin(server, capsys, tmp_path, monkeypatch) -> None:
    address, reward = server
    code, out, _ = run(capsys, "call", "reward", "Score", "-d", SCORE, "--address", address, "--timeout", "3")
    assert code == 0 and json.loads(out)["results"][0]["reward"] == 4.0
    assert 0 < reward.deadline <= 3.05
    (tmp_path / "req.json").write_text(SCORE)
    code, out, _ = run(capsys, "call", "reward", "Score", f"@{tmp_path / 'req.json'}", "--address", address)
    assert code == 0 and json.loads(out)["results"][0]["extracted_answer"] == "42"
    monkeypatch.setattr(sys, "stdin", io.StringIO(SCORE))
    code, out, _ = run(capsys, "call", "reward", "Score", "-", "--address", address)
    assert code == 0 and len(json.loads(out)["results"]) == 1


def test_address_comes_from_the_environment(server, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RLVR_REWARD_ADDRESS", server[0])
    code, out, _ = run(capsys, "call", "reward", "Score", SCORE)
    assert code == 0 and json.loads(out)["results"][0]["reward"] == 4.0


def test_server_stream_prints_json_lines(server, capsys) -> None:
    request = {"prompts": [{"text": "abc"}, {"text": "xyz"}], "n": 1}
    code, out, _ = run(capsys, "call", "rollout", "Generate", json.dumps(request), "--address", server[0])
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    completions = [json.loads(line)["completions"][0] for line in lines]
    assert [c["text"] for c in completions] == ["cba", "zyx"]
    assert completions[0]["adapter_version"] == "7"  # proto3 JSON: 64-bit integers as strings


def test_client_stream_takes_a_json_array(server, capsys) -> None:
    data = base64.b64encode(b"0123456789").decode()
    requests = [
        {"header": {"name": "math", "version": 2, "total_size": 10}},
        {"chunk": {"path": "adapter_model.safetensors", "data": data, "file_size": 10, "last": True}},
    ]
    code, out, _ = run(capsys, "call", "rollout", "LoadAdapter", json.dumps(requests), "--address", server[0])
    info = json.loads(out)
    assert code == 0 and (info["name"], info["version"], info["size_bytes"]) == ("math", "2", "10")
    code, _, err = run(
        capsys, "call", "rollout", "LoadAdapter", json.dumps(requests[0]), "--address", server[0]
    )
    assert code == 2 and "expected a JSON array" in err


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ('{"items": [', "invalid JSON"),
        ('{"itemz": []}', 'unknown field "itemz" (rlvr.v1.ScoreRequest has: function, items,'),
        ('{"items": [{"completionx": "a"}]}', 'unknown field "items[0].completionx"'),
        (
            '{"function": "MATH"}',
            'field "function": unknown value "MATH" for rlvr.v1.RewardFunction; one of:',
        ),
        ('{"items": [{"completion": 3}]}', 'field "items[0].completion": expected a string, got 3'),
        ('{"format_bonus_weight": "much"}', 'field "format_bonus_weight": expected a number'),
        ('{"items": {"completion": "a"}}', 'field "items": expected a JSON array'),
        ("[1, 2]", "expected a JSON object (rlvr.v1.ScoreRequest)"),
    ],
)
def test_bad_requests_name_the_field_in_one_line(capsys, request_text: str, expected: str) -> None:
    # No server: a bad request never leaves the machine.
    code, out, err = run(capsys, "call", "reward", "Score", request_text, "--address", "127.0.0.1:9")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: invalid request for rlvr.v1.RewardService/Score: ")
    assert expected in err


def test_oneof_alternatives_set_twice_are_refused(capsys) -> None:
    request = '{"prompts": [{"text": "a", "token_ids": {"ids": [1]}}]}'
    code, _, err = run(capsys, "call", "rollout", "Generate", request, "--address", "127.0.0.1:9")
    assert code == 2 and '"prompts[0].text" and "prompts[0].token_ids" are both set' in err


def test_grpc_errors_are_one_line_with_the_code(server, capsys) -> None:
    code, out, err = run(capsys, "call", "scheduler", "GetJob", '{"id": "j9"}', "--address", server[0])
    assert (code, out, err) == (1, "", "error: NOT_FOUND: job 'j9' not found\n")
    # Nothing listens on port 1; CreateJob is not retried, so this fails at once, in words.
    code, _, err = run(capsys, "call", "scheduler", "CreateJob", "--address", "127.0.0.1:1")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: cannot reach the scheduler service at 127.0.0.1:1: nothing listens there.")


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    return out


def test_help_lists_every_service_rpc_and_request_field(capsys) -> None:
    listing = _help(capsys, "call")
    for short, service in services().items():
        assert short in listing
        rpcs = _help(capsys, "call", short)
        for method in service.methods:
            assert method.name in rpcs, f"{method.full_name} missing from `rlvr call {short} --help`"
            text = _help(capsys, "call", short, method.name)
            assert method.input_type.full_name in text
            for field in method.input_type.fields:
                assert f"  {field.name}: " in text, f"{field.full_name} missing from {method.name} --help"
    score = _help(capsys, "call", "reward", "Score")
    assert "Scores a batch" in score  # the RPC's proto comment
    assert "values: REWARD_FUNCTION_UNSPECIFIED, REWARD_FUNCTION_MATH_PAIRS" in score
    assert "Range 0.0-1.0, default 0.1." in score  # a field's proto comment
    generate = _help(capsys, "call", "rollout", "Generate")
    assert "temperature: float" in generate and "seed: optional uint64" in generate  # nested, recursive


def test_incomplete_and_unknown_commands_exit_2(capsys) -> None:
    assert run(capsys, "call")[0] == 2
    assert run(capsys, "call", "reward")[0] == 2
    code, _, err = run(capsys, "call", "reward", "Score", "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in err and "rlvr call reward Score" in err
    assert run(capsys, "call", "nosuch")[0] == 2


def test_stack_and_models_hooks_load_their_modules_lazily(capsys, monkeypatch) -> None:
    seen: dict[str, object] = {}
    stack = types.ModuleType("rlvr.clients.stack")
    stack.add_arguments = lambda parser: parser.add_argument("--timeout", type=float, default=90.0)
    stack.up = lambda args: seen.setdefault("up", args.timeout) and 0
    stack.status = lambda args: 3
    monkeypatch.setitem(sys.modules, "rlvr.clients.stack", stack)
    assert run(capsys, "up", "--timeout", "5")[0] == 0 and seen["up"] == 5.0
    assert run(capsys, "status")[0] == 3

    tiny_main = types.ModuleType("rlvr.tiny.__main__")
    tiny_main.main = lambda argv: seen.setdefault("tiny", argv) and 0
    monkeypatch.setitem(sys.modules, "rlvr.tiny.__main__", tiny_main)
    assert run(capsys, "models", "build-tiny", "--size", "default")[0] == 0
    assert seen["tiny"] == ["build", "--size", "default"]


def test_a_missing_hook_module_is_one_clear_line(capsys) -> None:
    assert cli._lazy_module("rlvr.clients.no_such_module", "up") is None
    assert (
        "`rlvr up` is not available in this build (rlvr.clients.no_such_module is missing)"
        in capsys.readouterr().err
    )


def _subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT
    )


def test_console_entry_runs_as_a_module(server) -> None:
    done = _subprocess("-m", "rlvr.clients.cli", "call", "reward", "Score", SCORE, "--address", server[0])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"][0]["extracted_answer"] == "42"


def test_help_imports_no_ml_stack() -> None:
    code = (
        "import sys\n"
        "from clients import cli\n"
        "cli.build_parser().format_help()\n"
        "heavy = ('torch', 'vllm', 'transformers', 'peft', 'trl', 'datasets', 'rlvr.clients.stack', 'rlvr.tiny')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    done = _subprocess("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
