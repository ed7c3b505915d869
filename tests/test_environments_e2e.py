"""Bring your own environment, end to end on the real stack: embedded NATS, SQLite, the five services
as child processes, jobs, evaluations and a loop created through the public SDK.

Every service finds, through the `rlvr.environments` entry-point group, the test's own plugin
distribution (`countdown_env`: a `subtract` tool, written into a folder on the services'
PYTHONPATH), and through RLVR_REMOTE_ENVIRONMENTS the guess-the-number server that
tests/test_environment_remote.py writes from environment.proto alone (no rlvr import) and a key
whose port nobody listens on. Jobs train on the transformers backend, evaluations generate on the
rollout server (transformers too): what is checked is that episodes run in the environment named,
through every service, and how a bad environment is refused, not how much the model learns.

Slow (make test-all): 105-180 s on a shared 2-core host, most of it the stack's start, three
2-step jobs and four evaluations; every registry load also waits DOWN_WAIT_S for the down key.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from fixtures_rewards import write_distribution
from test_environment_remote import Server, stubs  # noqa: F401 (stubs: the module's fixture)

from rlvr.environments.registry import ENTRY_POINT_GROUP
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

pytestmark = pytest.mark.slow

MODEL = "rlvr-tiny-test"
SERVICES = ("scheduler", "trainer", "reward", "rollout", "benchmark")
DIST, DIST_VERSION = "rlvr-test-countdown", "0.1"  # write_distribution's version
BUILTINS = ("calculator", "calculator_agent", "code_run", "guess_number")
DOWN_WAIT_S = 1.0  # how long each look at the down key rides over it being unreachable

COUNTDOWN = '''
from rlvr.environments import Environment, environment, tool


@environment("countdown_env", display_name="Countdown", version="3", max_turns=3)
class Countdown(Environment):
    """Math pairs with a subtract tool; the first answer without a tool call ends the episode."""

    def __init__(self):
        self.calls = []

    @tool
    def subtract(self, a: int, b: int) -> int:
        """Subtracts one integer from another.

        Args:
            a: the number to subtract from
            b: the number to subtract
        """
        self.calls.append([a, b])
        return a - b

    def state(self):
        return {"subtractions": self.calls}
'''


# The test's own AGENT plugin: a plain (not async) function written against the `openai` client alone
# (the `agent` declaration aside), so it runs in a worker thread of the service that runs its episode
# and its calls reach that process's OpenAI-compatible endpoint. It scores its own answer.
COUNTDOWN_AGENT = '''
import json

import openai

from rlvr.agents import AgentResult, AgentRow, agent

TOOLS = [{"type": "function", "function": {
    "name": "subtract", "description": "Subtracts one integer from another.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


@agent("countdown_agent", display_name="Countdown agent", version="5", max_turns=3, timeout_seconds=120)
def countdown_agent(client: openai.OpenAI, row: AgentRow) -> AgentResult:
    """Math pairs with a subtract tool, as an OpenAI client loop that checks its own answer."""
    messages, text = list(row.messages), ""
    for _ in range(3):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        choice = reply.choices[0]
        text = choice.message.content or ""
        messages.append(choice.message.model_dump(exclude_none=True))
        if not choice.message.tool_calls or choice.finish_reason == "length":
            break
        for call in choice.message.tool_calls:
            try:
                args = json.loads(call.function.arguments)
                result = str(int(args["a"]) - int(args["b"]))
            except (ValueError, KeyError, TypeError) as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    solved = float(f"<answer>{row.ground_truth}</answer>" in text)
    return AgentResult(reward=solved, components={"solved": solved, "answered": float("<answer>" in text)},
                       answer=text)
'''
AGENT_DIST = "rlvr-test-countdown-agent"
AGENT_STATE = {"model_calls", "splits", "history_rewrites", "calls_past_limits"}  # what an agent episode keeps


def write_entry_point(root: Path, dist: str, module: str, source: str, entry_point: str) -> None:
    """An installed distribution: its module and a dist-info declaring `entry_point` in the
    `rlvr.environments` group (write_distribution writes the rewards group's entry points)."""
    write_distribution(root, dist, {module: source}, {})
    info = root / f"{dist.replace('-', '_')}-{DIST_VERSION}.dist-info"
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_point}\n")


def write_plugin(root: Path) -> Path:
    """The test's own plugins: the environment `countdown_env` and the agent `countdown_agent`."""
    write_entry_point(root, DIST, "rlvr_test_countdown", COUNTDOWN, "countdown_env = rlvr_test_countdown:Countdown")
    write_entry_point(root, AGENT_DIST, "rlvr_test_countdown_agent", COUNTDOWN_AGENT,
                      "countdown_agent = rlvr_test_countdown_agent:countdown_agent")
    return root


def write_guess_data(folder: Path) -> Path:
    """The remote game's questions: prompt and ground truth (the boxed reward's columns) and the `high`
    column the game declares it reads."""
    folder.mkdir(parents=True)
    for split, n in (("train", 8), ("test", 4)):
        rows = [{"prompt": f"Guess my number ({split} game {i}).", "ground_truth": "1", "high": 4 + i}
                for i in range(n)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, stubs: Path) -> Iterator[tuple[object, dict[str, str], Path]]:  # noqa: F811
    from rlvr.clients.sdk import connect
    from rlvr.clients.stack import Stack, StackConfig, free_port

    home = tmp_path_factory.mktemp("environments")
    plugins = write_plugin(home / "site")
    data = home / "data"
    guess_data = write_guess_data(data / "guess")
    game = Server(stubs)
    addresses = {"guess": game.address, "down": f"127.0.0.1:{free_port()}"}
    remote = {"guess": addresses["guess"], "down": {"address": addresses["down"], "wait_seconds": DOWN_WAIT_S}}
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "RLVR_REMOTE_ENVIRONMENTS": json.dumps(remote),
           **{f"RLVR_{s.upper()}_DATA_ROOTS": json.dumps([str(data)]) for s in ("scheduler", "trainer", "reward")}}
    cfg = StackConfig(home=home, model=MODEL, ports={name: free_port() for name in SERVICES},
                      rollout_backend="transformers", start_timeout=300.0, log_format="text")
    log = open(home / "stack.out", "w")  # noqa: SIM115
    running = Stack(cfg, out=log)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            running.start()
        assert running.wait_serving(), (home / "stack.out").read_text()
        client = connect(running.client_settings())
        yield client, addresses, guess_data
        client.close()
    finally:
        running.stop()
        log.close()
        game.kill()


def job_spec(name: str, reward: C.RewardConfig, environment: str, max_turns: int = 3) -> C.JobSpec:
    spec = C.JobSpec(name=name, base_model=MODEL, reward=reward,
                     environment=C.EnvironmentConfig(key=environment, max_turns=max_turns))
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 2, 4, 32, 2
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 16, 1e-5
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    return spec


def countdown_job(name: str, environment: str = "countdown_env") -> C.JobSpec:
    return job_spec(name, C.RewardConfig(key="math_pairs"), environment)


def guess_job(name: str, data: Path) -> C.JobSpec:
    return job_spec(name, C.RewardConfig(key="boxed", dataset=str(data)), "guess")


def run_job(client, spec: C.JobSpec) -> C.Job:  # noqa: ANN001 (the SDK facade)
    created = client.scheduler.create_job(S.CreateJobRequest(spec=spec))
    for _ in client.scheduler.watch(created.job.id, timeout=600):
        pass
    return client.scheduler.get_job(S.GetJobRequest(id=created.job.id))


def refused(client, spec: C.JobSpec):  # noqa: ANN001, ANN201
    from rlvr.peers.base import RlvrError

    with pytest.raises(RlvrError) as caught:
        client.scheduler.create_job(S.CreateJobRequest(spec=spec))
    return caught.value


def evaluate(client, request: B.RunEvaluationRequest) -> tuple[B.Evaluation, list[B.QuestionResult]]:  # noqa: ANN001
    evaluation = client.benchmark.run_evaluation(request)
    for _ in client.benchmark.watch_evaluation(B.WatchEvaluationRequest(id=evaluation.id), timeout=300):
        pass
    done = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=evaluation.id))
    results = client.benchmark.get_evaluation_results(B.GetEvaluationResultsRequest(id=evaluation.id)).results
    return done, list(results)


def assert_episode_rows(results: list[B.QuestionResult], n: int, max_turns: int, state: set[str]) -> None:
    """Each question's row holds its episode: the turns taken (within the limit), how it ended, and the
    final state of the environment's own instance (`state`: its keys)."""
    assert len(results) == n
    for row in results:
        episode = json.loads(row.episode)
        assert 1 <= len(episode["turns"]) <= max_turns, episode
        assert all("assistant" in t and "tool_calls" in t for t in episode["turns"]), episode
        assert episode["ended_by"] and not episode["error"], episode
        assert set(episode["state"]) == state, episode
        assert "[turn 1]" in row.completion, row.completion  # the transcript, turn by turn


def assert_episode_metrics(client, job: C.Job) -> None:  # noqa: ANN001
    metrics = client.scheduler.get_job_metrics(S.GetJobMetricsRequest(job_id=job.id))
    assert metrics.has_episodes
    points = list(metrics.series)
    assert [p.step for p in points] == [1, 2]
    for p in points:
        assert p.HasField("turns_mean") and p.HasField("tool_calls") and p.HasField("tool_errors"), p
        assert 1 <= p.turns_mean <= 3
    export = client.scheduler.export_history(S.ExportHistoryRequest(job_id=job.id, format=S.EXPORT_FORMAT_JSONL))
    rows = [json.loads(line) for line in export.content.decode().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["turns_mean"] is not None and r["tool_calls"] is not None for r in rows), rows


def test_every_environment_is_listed_and_a_down_one_named_with_its_address(stack) -> None:
    client, addresses, _ = stack
    listed = {e.key: e for e in client.scheduler.environments()}
    assert set(BUILTINS) <= set(listed) and all(listed[k].source == "built-in" for k in BUILTINS)
    countdown = listed["countdown_env"]
    assert countdown.source == f"plugin {DIST} {DIST_VERSION}"
    assert (countdown.display_name, countdown.version, list(countdown.tools), countdown.max_turns) == (
        "Countdown", "3", ["subtract"], 3)
    guess = listed["guess"]
    assert guess.source == f"remote {addresses['guess']}"
    assert (guess.version, list(guess.tools), list(guess.columns)) == ("2", ["compare"], ["high"])
    assert "down" not in listed
    unavailable = {u.key: u.error for u in client.scheduler.list_environments(S.ListEnvironmentsRequest()).unavailable}
    assert unavailable["down"].startswith(f"remote environment 'down' at {addresses['down']}: Describe failed: "
                                          "UNAVAILABLE"), unavailable


def test_the_plugin_environment_trains_a_job_and_runs_an_evaluation(stack) -> None:
    client, _, _ = stack
    job = run_job(client, countdown_job("countdown"))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    resolved = job.spec.environment
    assert (resolved.key, resolved.version, resolved.max_turns) == ("countdown_env", "3", 3)
    assert resolved.max_episode_tokens == 4 * 32
    assert_episode_metrics(client, job)

    done, results = evaluate(client, B.RunEvaluationRequest(
        benchmark="rlvr-math-pairs-heldout", limit=4, environment=C.EnvironmentConfig(key="countdown_env", max_turns=3)))
    assert done.status == B.EVALUATION_STATUS_COMPLETED, done.error
    assert (done.environment.key, done.environment.version, done.environment.max_turns) == ("countdown_env", "3", 3)
    assert done.questions_total == 4 and done.episodes.episodes == 4
    assert 1 <= done.episodes.turns_mean <= 3
    assert_episode_rows(results, 4, 3, {"subtractions"})  # the plugin's own instance ran each episode


def test_the_remote_environment_trains_a_job_and_runs_an_evaluation(stack) -> None:
    client, _, data = stack
    job = run_job(client, guess_job("guess", data))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    assert (job.spec.environment.key, job.spec.environment.version) == ("guess", "2")
    assert_episode_metrics(client, job)
    for p in client.scheduler.get_job_metrics(S.GetJobMetricsRequest(job_id=job.id)).series:
        # the game scores its episodes itself (Finish): its components, not the boxed reward's
        assert {"solved", "efficiency"} <= {k.rsplit(".", 1)[-1] for k in p.reward_components}, p.reward_components

    done, results = evaluate(client, B.RunEvaluationRequest(
        benchmark="boxed", dataset=str(data), limit=4, environment=C.EnvironmentConfig(key="guess", max_turns=3)))
    assert done.status == B.EVALUATION_STATUS_COMPLETED, done.error
    assert (done.environment.key, done.environment.version) == ("guess", "2")
    assert done.questions_total == 4 and done.episodes.episodes == 4
    assert_episode_rows(results, 4, 3, {"secret", "guesses", "tool_calls"})  # the game's state, from its Finish


def refused_while_answering(call, probe):  # noqa: ANN001, ANN201
    """`call`'s RlvrError, and how long `probe` (another call to the same service) took while `call`
    was waiting for the down server: a service must keep answering meanwhile."""
    from rlvr.peers.base import RlvrError

    def expect_refusal() -> RlvrError:
        with pytest.raises(RlvrError) as caught:
            call()
        return caught.value

    with ThreadPoolExecutor(1) as pool:
        refusal = pool.submit(expect_refusal)
        time.sleep(0.2)  # the call is now waiting up to DOWN_WAIT_S for the down server ...
        started = time.monotonic()
        probe()
        answered = time.monotonic() - started
        return refusal.result(), answered


def test_a_down_or_unknown_environment_is_refused_before_anything_is_created(stack) -> None:
    client, addresses, data = stack
    before = client.scheduler.list_jobs(S.ListJobsRequest()).total
    evaluations = client.benchmark.list_evaluations(B.ListEvaluationsRequest()).total
    spec = job_spec("down", C.RewardConfig(key="boxed", dataset=str(data)), "down")
    down, answered = refused_while_answering(lambda: client.scheduler.create_job(S.CreateJobRequest(spec=spec)),
                                             lambda: client.scheduler.list_jobs(S.ListJobsRequest()))
    assert down.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT), down
    assert "'down'" in down.details and addresses["down"] in down.details, down.details
    assert answered < DOWN_WAIT_S / 2, f"the scheduler answered nothing else for {answered:.1f} s"  # ... elsewhere

    request = B.RunEvaluationRequest(benchmark="boxed", dataset=str(data), limit=4,
                                     environment=C.EnvironmentConfig(key="down"))
    down, answered = refused_while_answering(lambda: client.benchmark.run_evaluation(request),
                                             lambda: client.benchmark.list_evaluations(B.ListEvaluationsRequest()))
    assert down.code == grpc.StatusCode.FAILED_PRECONDITION, down
    assert "'down'" in down.details and addresses["down"] in down.details, down.details
    assert answered < DOWN_WAIT_S / 2, f"the benchmark service answered nothing else for {answered:.1f} s"

    unknown = refused(client, job_spec("unknown", C.RewardConfig(key="math_pairs"), "no_such_env"))
    assert unknown.code == grpc.StatusCode.INVALID_ARGUMENT
    assert unknown.details.startswith("environment.key: 'no_such_env' is not an environment; known: "), unknown.details
    for key in (*BUILTINS, "countdown_env", "guess"):
        assert key in unknown.details, (key, unknown.details)
    assert client.scheduler.list_jobs(S.ListJobsRequest()).total == before  # nothing created
    assert client.benchmark.list_evaluations(B.ListEvaluationsRequest()).total == evaluations


def test_a_loop_of_environment_jobs_evaluates_its_round_in_the_environment(stack) -> None:
    client, _, _ = stack
    spec = S.LoopSpec(name="countdown loop", target=100.0, max_rounds=1, benchmark_limit=4,
                      job=countdown_job(""))
    loop = client.scheduler.create_loop(S.CreateLoopRequest(spec=spec)).loop
    assert loop.spec.benchmark == "rlvr-math-pairs-heldout"  # the rounds' reward's benchmark
    final = list(client.scheduler.watch_loop(S.WatchLoopRequest(id=loop.id), timeout=600))[-1]
    assert final.status in (S.LOOP_STATUS_ROUNDS_SPENT, S.LOOP_STATUS_TARGET_REACHED), final.message
    [round_] = final.rounds
    assert round_.job_id and round_.HasField("score") and round_.evaluation_id, round_
    evaluation = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=round_.evaluation_id))
    assert evaluation.status == B.EVALUATION_STATUS_COMPLETED, evaluation.error
    assert (evaluation.environment.key, evaluation.environment.version) == ("countdown_env", "3")
    results = client.benchmark.get_evaluation_results(B.GetEvaluationResultsRequest(id=evaluation.id)).results
    assert_episode_rows(list(results), 4, 3, {"subtractions"})


def test_the_plugin_agent_is_listed_trains_a_job_and_runs_an_evaluation(stack) -> None:
    client, _, _ = stack
    listed = {e.key: e for e in client.scheduler.environments()}["countdown_agent"]
    assert listed.source == f"plugin {AGENT_DIST} {DIST_VERSION}"
    assert (listed.display_name, listed.version, list(listed.tools), listed.max_turns) == (
        "Countdown agent", "5", [], 3)

    job = run_job(client, countdown_job("countdown agent", "countdown_agent"))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    resolved = job.spec.environment
    assert (resolved.key, resolved.version, resolved.max_turns) == ("countdown_agent", "5", 3)
    assert_episode_metrics(client, job)
    for p in client.scheduler.get_job_metrics(S.GetJobMetricsRequest(job_id=job.id)).series:
        # the agent scored its episodes itself (its AgentResult): its components, not math_pairs'
        assert {"solved", "answered"} <= {k.rsplit(".", 1)[-1] for k in p.reward_components}, p.reward_components
    export = client.scheduler.export_history(S.ExportHistoryRequest(job_id=job.id, format=S.EXPORT_FORMAT_JSONL))
    assert [json.loads(line)["failed_episodes"] for line in export.content.decode().splitlines()] == [0, 0]

    done, results = evaluate(client, B.RunEvaluationRequest(
        benchmark="rlvr-math-pairs-heldout", limit=4, environment=C.EnvironmentConfig(key="countdown_agent")))
    assert done.status == B.EVALUATION_STATUS_COMPLETED, done.error
    assert (done.environment.key, done.environment.version, done.environment.max_turns) == ("countdown_agent", "5", 3)
    assert done.questions_total == 4 and done.episodes.episodes == 4 and done.episodes.failed_episodes == 0
    assert 1 <= done.episodes.turns_mean <= 3
    assert_episode_rows(results, 4, 3, AGENT_STATE)  # the plugin's function ran each episode, through the endpoint
    for row in results:
        state = json.loads(row.episode)["state"]
        assert state["model_calls"] == len(json.loads(row.episode)["turns"]), state
        assert row.accuracy == float(f"<answer>{row.ground_truth}</answer>" in row.completion)  # the agent's own


def test_a_loop_of_agent_jobs_evaluates_its_round_in_the_agent(stack) -> None:
    client, _, _ = stack
    spec = S.LoopSpec(name="countdown agent loop", target=100.0, max_rounds=1, benchmark_limit=4,
                      job=countdown_job("", "countdown_agent"))
    loop = client.scheduler.create_loop(S.CreateLoopRequest(spec=spec)).loop
    assert loop.spec.benchmark == "rlvr-math-pairs-heldout"  # the rounds' reward's benchmark
    final = list(client.scheduler.watch_loop(S.WatchLoopRequest(id=loop.id), timeout=600))[-1]
    assert final.status in (S.LOOP_STATUS_ROUNDS_SPENT, S.LOOP_STATUS_TARGET_REACHED), final.message
    [round_] = final.rounds
    assert round_.job_id and round_.HasField("score") and round_.evaluation_id, round_
    job = client.scheduler.get_job(S.GetJobRequest(id=round_.job_id))
    assert job.status == C.JOB_STATUS_COMPLETED and job.spec.environment.key == "countdown_agent", job.error
    evaluation = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=round_.evaluation_id))
    assert evaluation.status == B.EVALUATION_STATUS_COMPLETED, evaluation.error
    assert (evaluation.environment.key, evaluation.environment.version) == ("countdown_agent", "5")
    assert evaluation.episodes.failed_episodes == 0
    results = client.benchmark.get_evaluation_results(B.GetEvaluationResultsRequest(id=evaluation.id)).results
    assert_episode_rows(list(results), 4, 3, AGENT_STATE)
