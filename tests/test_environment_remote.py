"""A remote environment: a server of a user's own, written from protos/rlvr/v1/environment.proto alone
(`SERVER` below imports grpc and the messages protoc generates into a folder of the test's, never
rlvr), played through rlvr.environments.remote: an episode of its guess-a-number game (reset, a tool
call, steps, finish, close), and its faults: down at start, killed mid-episode, slow, garbage
answers (each refused for its episode with the reason), a wrong token.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlvr.common.auth import ChannelAuth
from rlvr.environments.base import EnvironmentDefinition, EpisodeRow
from rlvr.environments.remote import (
    RemoteEnvironment,
    RemoteEnvironmentError,
    RemoteToolError,
    remote_definition,
    remote_definition_async,
    remote_definitions,
)
from rlvr.environments.settings import EnvironmentSettings
from rlvr.rewards.registry import RewardOutput

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "s3cret-environment-token"

SERVER = textwrap.dedent('''
    """Guess the number, as a remote environment server written from environment.proto alone.

        python server.py GENERATED_DIR PORT [TOKEN]

    Keys: "guess" (the game), "bad_tools" (Describe answers a tool schema that is not JSON),
    "other_key" (Describe answers for another key). An episode's settings ask for garbage or
    slowness: garbage = nan_reward | state_list | step_reward | components_only | huge_text;
    slow_step / slow_tool = seconds. Prints "READY PORT" once it serves."""

    import json
    import math
    import sys
    import threading
    import time
    from concurrent import futures

    sys.path.insert(0, sys.argv[1])  # the generated rlvr/v1 messages, ahead of any installed rlvr

    import grpc  # noqa: E402

    from rlvr.v1 import environment_pb2 as pb, environment_pb2_grpc as pb_grpc  # noqa: E402

    assert pb.__file__.startswith(sys.argv[1]), pb.__file__  # the generated stubs, not rlvr's
    TOKEN = sys.argv[3] if len(sys.argv) > 3 else ""
    COMPARE = {"type": "function", "function": {
        "name": "compare", "description": "Compares a guess with the secret number.",
        "parameters": {"type": "object", "properties": {"guess": {"type": "integer", "description": "a guess"}},
                       "required": ["guess"]}}}


    class Game(pb_grpc.EnvironmentServiceServicer):
        def __init__(self):
            self.lock = threading.Lock()
            self.episodes = {}

        def _auth(self, context):
            if TOKEN and dict(context.invocation_metadata()).get("authorization") != f"Bearer {TOKEN}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required")

        def _episode(self, episode_id, context):
            self._auth(context)
            with self.lock:
                episode = self.episodes.get(episode_id)
            if episode is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no episode {episode_id}")
            return episode

        def Describe(self, request, context):
            self._auth(context)
            if request.key == "bad_tools":
                return pb.DescribeEnvironmentResponse(tools=["{not json"])
            if request.key == "other_key":
                return pb.DescribeEnvironmentResponse(key="somebody_else", display_name="Other")
            return pb.DescribeEnvironmentResponse(
                key=request.key, display_name="Guess the number", description="Find the secret number.",
                version="2", tools=[json.dumps(COMPARE)], max_turns=6, columns=["high"],
                instruction="Answer with one number.", tool_timeout_seconds=0.5)

        def Reset(self, request, context):
            self._auth(context)
            unknown = set(request.settings) - {"garbage", "slow_step", "slow_tool"}
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown settings {sorted(unknown)}")
            high = int(request.columns["high"].number_value) if "high" in request.columns else 100
            with self.lock:
                if request.episode_id in self.episodes:
                    context.abort(grpc.StatusCode.ALREADY_EXISTS, f"episode {request.episode_id} exists")
                self.episodes[request.episode_id] = {
                    "secret": 1 + request.seed % high, "guesses": 0, "tools": 0, "solved": False,
                    "settings": dict(request.settings), "prompt": request.prompt}
            return pb.ResetEpisodeResponse(prompt_addition=f"The secret is between 1 and {high}.")

        def CallTool(self, request, context):
            episode = self._episode(request.episode_id, context)
            time.sleep(float(episode["settings"].get("slow_tool", 0)))
            if request.name != "compare":
                return pb.CallToolResponse(error=f"no tool {request.name}")
            try:
                guess = int(json.loads(request.arguments_json)["guess"])
            except (KeyError, TypeError, ValueError):
                return pb.CallToolResponse(error="compare takes one integer, guess")
            episode["tools"] += 1
            secret = episode["secret"]
            return pb.CallToolResponse(content="equal" if guess == secret else "higher" if secret > guess else "lower")

        def Step(self, request, context):
            episode = self._episode(request.episode_id, context)
            garbage = episode["settings"].get("garbage")
            time.sleep(float(episode["settings"].get("slow_step", 0)))
            words = [w for w in request.text.replace(".", " ").split() if w.lstrip("-").isdigit()]
            episode["guesses"] += 1
            episode["solved"] = bool(words) and int(words[-1]) == episode["secret"]
            if garbage == "step_reward":
                return pb.StepEpisodeResponse(text="?", reward=7.0)
            if garbage == "huge_text":
                return pb.StepEpisodeResponse(text="x" * 1_000_001)
            if episode["solved"]:
                return pb.StepEpisodeResponse(text="Correct!", done=True, reward=0.1)
            return pb.StepEpisodeResponse(text="Wrong, guess again.", done=episode["guesses"] >= 3)

        def Finish(self, request, context):
            episode = self._episode(request.episode_id, context)
            garbage = episode["settings"].get("garbage")
            state = {"secret": episode["secret"], "guesses": episode["guesses"], "tool_calls": episode["tools"]}
            if garbage == "nan_reward":
                return pb.FinishEpisodeResponse(reward=math.nan, state_json=json.dumps(state))
            if garbage == "state_list":
                return pb.FinishEpisodeResponse(reward=1.0, state_json="[1, 2]")
            if garbage == "components_only":
                reply = pb.FinishEpisodeResponse(state_json=json.dumps(state))
                reply.components["solved"] = 1.0
                return reply
            reply = pb.FinishEpisodeResponse(reward=1.0 if episode["solved"] else 0.0, state_json=json.dumps(state))
            reply.components["solved"] = 1.0 if episode["solved"] else 0.0
            reply.components["efficiency"] = 1.0 / episode["guesses"] if episode["guesses"] else 0.0
            return reply

        def Close(self, request, context):
            self._auth(context)
            with self.lock:
                self.episodes.pop(request.episode_id, None)
            return pb.CloseEpisodeResponse()


    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_EnvironmentServiceServicer_to_server(Game(), server)
    port = server.add_insecure_port(f"127.0.0.1:{sys.argv[2]}")
    server.start()
    print(f"READY {port}", flush=True)
    server.wait_for_termination()
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """environment.proto (and the common.proto it imports) compiled by protoc into a folder of its own."""
    import grpc_tools
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("generated")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    protos = [str(ROOT / "protos" / "rlvr" / "v1" / name) for name in ("common.proto", "environment.proto")]
    assert protoc.main(["protoc", f"-I{ROOT / 'protos'}", f"-I{well_known}", f"--python_out={out}",
                        f"--grpc_python_out={out}", *protos]) == 0
    for package in (out / "rlvr", out / "rlvr" / "v1"):
        (package / "__init__.py").touch()
    (out / "server.py").write_text(SERVER)
    return out


class Server:
    """One server process on a port of its own; `kill` ends it at once (SIGKILL)."""

    def __init__(self, stubs: Path, token: str = "") -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, str(stubs / "server.py"), str(stubs), str(self.port),
                                      *([token] if token else [])], stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("READY"), f"the remote environment server did not start: {line!r}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def serve(stubs: Path, token: str = "") -> Iterator[Server]:
    server = Server(stubs, token)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def server(stubs: Path) -> Iterator[Server]:
    yield from serve(stubs)


@pytest.fixture(scope="module")
def guess(server: Server) -> EnvironmentDefinition:
    return remote_definition("guess", server.address, timeout_seconds=5.0)


ROW = EpisodeRow(prompt="Guess my number.", ground_truth="", columns={"high": 10}, seed=6)  # the secret is 7


def test_describe_makes_the_definition(guess: EnvironmentDefinition, server: Server) -> None:
    assert (guess.key, guess.display_name, guess.version, guess.source) == (
        "guess", "Guess the number", "2", f"remote {server.address}")
    assert (guess.tools, guess.max_turns, guess.columns, guess.tool_timeout_seconds) == (("compare",), 6, ("high",), 0.5)
    assert guess.instruction == "Answer with one number."
    env = guess.make({})
    assert isinstance(env, RemoteEnvironment)
    [schema] = env.tool_schemas()
    assert schema["type"] == "function" and schema["function"]["name"] == "compare"
    assert schema["function"]["parameters"]["required"] == ["guess"]
    [tool] = env.tools()
    assert tool.__name__ == "compare" and tool.__rlvr_tool_schema__ == schema  # type: ignore[attr-defined]


async def test_an_episode_of_the_game(guess: EnvironmentDefinition) -> None:
    env = guess.make({})
    assert isinstance(env, RemoteEnvironment)
    assert await env.reset(ROW) == "The secret is between 1 and 10."
    [compare] = env.tools()
    assert await compare(guess=3) == "higher"
    assert await compare(guess=9) == "lower"
    with pytest.raises(RemoteToolError, match="one integer"):
        await compare(guess="many")  # the tool's own error: the policy reads it, the episode goes on
    reply = await env.step("I think it is 5.")
    assert (reply.text, reply.done, reply.reward) == ("Wrong, guess again.", False, None)
    reply = await env.step("It is 7.")
    assert (reply.text, reply.done, reply.reward) == ("Correct!", True, pytest.approx(0.1))
    reward = await env.reward()
    assert isinstance(reward, RewardOutput)
    assert reward.score == 1.0 and reward.components == {"solved": 1.0, "efficiency": 0.5}
    assert await env.state() == {"secret": 7, "guesses": 2, "tool_calls": 2}
    await env.close()
    await env.close()  # once only
    with pytest.raises(RemoteEnvironmentError, match="Step failed: .*closed"):
        await env.step("7")


async def test_episodes_run_side_by_side(guess: EnvironmentDefinition) -> None:
    envs = [guess.make({}) for _ in range(8)]
    rows = [EpisodeRow(prompt="Guess.", columns={"high": 100}, seed=seed) for seed in range(8)]
    await asyncio.gather(*(e.reset(r) for e, r in zip(envs, rows, strict=True)))
    replies = await asyncio.gather(*(e.step(str(1 + seed)) for seed, e in enumerate(envs)))
    assert all(r.done and r.text == "Correct!" for r in replies)
    assert [await e.reward() for e in envs] == [RewardOutput(1.0, {"solved": 1.0, "efficiency": 1.0})] * 8
    await asyncio.gather(*(e.close() for e in envs))


async def test_an_unknown_setting_is_refused_at_reset(guess: EnvironmentDefinition, server: Server) -> None:
    env = guess.make({"colour": "red"})
    with pytest.raises(RemoteEnvironmentError) as failed:
        await env.reset(ROW)
    assert str(failed.value).startswith(f"remote environment 'guess' at {server.address}: Reset failed: "
                                        "INVALID_ARGUMENT: unknown settings ['colour']")
    with pytest.raises(RemoteEnvironmentError, match="Reset failed"):  # the failure sticks
        await env.step("7")
    await env.close()


def test_down_at_start_names_the_key_and_address() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(RemoteEnvironmentError) as failed:
        remote_definition("guess", address, wait_seconds=0.3)
    message = str(failed.value)
    assert message.startswith(f"remote environment 'guess' at {address}: Describe failed: UNAVAILABLE: "
                              "unreachable after 0.3 s")
    assert "\n" not in message
    assert failed.value.code is not None and failed.value.code.name == "UNAVAILABLE"


async def test_down_at_start_async() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(RemoteEnvironmentError, match=f"'guess' at {address}: Describe failed: UNAVAILABLE"):
        await remote_definition_async("guess", address)


def test_settings_map_keys_to_servers(server: Server, tmp_path: Path) -> None:
    down = f"127.0.0.1:{free_port()}"
    settings = EnvironmentSettings(remote_environments=json.dumps({
        "guess": server.address, "gone": {"address": down, "wait_seconds": 0},
        "bad_tools": server.address, "other_key": server.address,
        "no_token": {"address": server.address, "token_file": str(tmp_path / "missing")}}))
    found, errors = remote_definitions(settings.remote_environments)
    assert [d.key for d in found] == ["guess"]
    assert errors["gone"].startswith(f"remote environment 'gone' at {down}: Describe failed: UNAVAILABLE")
    assert errors["bad_tools"] == (f"remote environment 'bad_tools' at {server.address}: Describe failed: "
                                   "answered garbage: tool 1 is not JSON (Expecting property name enclosed in "
                                   "double quotes at 1): '{not json'")
    assert errors["other_key"].endswith("Describe failed: answered garbage: it answers for key 'somebody_else'")
    assert errors["no_token"].startswith("remote_environments.no_token.token_file: cannot read")


def test_the_environment_variable_maps_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLVR_REMOTE_ENVIRONMENTS", '{"guess": "127.0.0.1:7000", "other": {"address": "h:1", '
                       '"timeout_seconds": 3, "token_file": "/run/secrets/t"}}')
    remote = EnvironmentSettings().remote_environments
    assert remote["guess"].address == "127.0.0.1:7000" and remote["guess"].timeout_seconds == 30.0
    assert remote["other"].timeout_seconds == 3.0 and remote["other"].token_file == Path("/run/secrets/t")
    for bad, why in (('{"Guess": "h:1"}', "key 'Guess' is not allowed"), ('{"guess": "nohost"}', "is not HOST:PORT"),
                     ("{nope", "not a JSON object")):
        monkeypatch.setenv("RLVR_REMOTE_ENVIRONMENTS", bad)
        with pytest.raises(ValueError, match=why):
            EnvironmentSettings()


@pytest.mark.parametrize(("garbage", "call", "reason"), [
    ("step_reward", "Step", "reward 7.0 is not a finite number in [-1, 1]"),
    ("huge_text", "Step", "text has 1000001 characters, more than 1000000"),
    ("nan_reward", "Finish", "score nan is not in [0, 1]"),
    ("state_list", "Finish", "state_json is JSON list, not an object"),
    ("components_only", "Finish", "components without a reward"),
])
async def test_garbage_is_refused_per_episode(guess: EnvironmentDefinition, server: Server, garbage: str,
                                             call: str, reason: str) -> None:
    bad, good = guess.make({"garbage": garbage}), guess.make({})
    await asyncio.gather(bad.reset(ROW), good.reset(ROW))
    with pytest.raises(RemoteEnvironmentError) as failed:
        await bad.step("5")
        await bad.reward()
    assert str(failed.value) == (f"remote environment 'guess' at {server.address}: {call} failed: "
                                 f"answered garbage: {reason}")
    with pytest.raises(RemoteEnvironmentError) as again:  # sticks: the episode is over
        await bad.state()
    assert again.value is failed.value
    await bad.close()
    assert (await good.step("7")).done and await good.reward() == RewardOutput(1.0, {"solved": 1.0, "efficiency": 1.0})
    await good.close()


async def test_deadlines(guess: EnvironmentDefinition, server: Server) -> None:
    # A tool past its time limit (Describe's 0.5 s) is the policy's to read, and the episode goes on.
    env = guess.make({"slow_tool": "1.5"})
    await env.reset(ROW)
    [compare] = env.tools()
    with pytest.raises(TimeoutError, match="compare took more than 0.5 s"):
        await compare(guess=1)
    assert (await env.step("7")).done
    await env.close()
    # A Step past the key's deadline ends the episode.
    slow = remote_definition("guess", server.address, timeout_seconds=0.5).make({"slow_step": "1.5"})
    await slow.reset(ROW)
    with pytest.raises(RemoteEnvironmentError, match=r"Step failed: DEADLINE_EXCEEDED"):
        await slow.step("7")
    await slow.close()


async def test_a_server_killed_mid_episode_ends_the_episode(stubs: Path) -> None:
    for doomed in serve(stubs):
        definition = remote_definition("guess", doomed.address, timeout_seconds=5.0)
        env = definition.make({})
        await env.reset(ROW)
        [compare] = env.tools()
        assert await compare(guess=7) == "equal"
        doomed.kill()
        with pytest.raises(RemoteEnvironmentError) as failed:
            await compare(guess=7)
        assert str(failed.value).startswith(f"remote environment 'guess' at {doomed.address}: CallTool failed: "
                                            "UNAVAILABLE")
        with pytest.raises(RemoteEnvironmentError) as again:  # a tool runner that swallowed it cannot go on
            await env.step("7")
        assert again.value is failed.value
        await env.close()  # best effort: no error


async def test_a_token_is_sent_and_a_wrong_one_refused(stubs: Path, tmp_path: Path) -> None:
    for guarded in serve(stubs, TOKEN):
        with pytest.raises(RemoteEnvironmentError, match="Describe failed: UNAUTHENTICATED: a bearer token is required"):
            remote_definition("guess", guarded.address, auth=ChannelAuth(token="wrong"))
        (tmp_path / "token").write_text(TOKEN + "\n")
        settings = EnvironmentSettings(remote_environments={
            "guess": {"address": guarded.address, "token_file": str(tmp_path / "token")}})
        [definition], errors = remote_definitions(settings.remote_environments)
        assert not errors
        env = definition.make({})
        await env.reset(ROW)
        assert (await env.step("7")).done and (await env.reward()).score == 1.0
        await env.close()


def test_the_registry_merges_remote_environments_and_remembers_a_down_one_for_a_while(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.environments import registry, remote

    registry.clear_cache()
    down = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("RLVR_REMOTE_ENVIRONMENTS", json.dumps(
        {"guess": server.address, "gone": {"address": down, "wait_seconds": 0.2}}))
    asked: list[str] = []
    describe = remote.remote_definitions

    def counting(entries):  # noqa: ANN001, ANN202
        asked.extend(entries)
        return describe(entries)

    monkeypatch.setattr(remote, "remote_definitions", counting)
    try:
        first = registry.load_registry()
        assert first.get("guess").source == f"remote {server.address}"
        assert down in first.failed["gone"] and "calculator" in first.environments
        again = registry.load_registry()  # described once; the down one remembered, not waited for again
        assert again.get("guess") is first.get("guess") and down in again.failed["gone"]
        assert sorted(asked) == ["gone", "guess"]
        monkeypatch.setattr(registry, "REMOTE_RETRY_SECONDS", 0.0)
        registry.load_registry()
        assert sorted(asked) == ["gone", "gone", "guess"]  # asked again once the while is over
    finally:
        registry.clear_cache()
