"""The rollout and reward services as the evaluation core sees them (planning.Peers, runner's
Generator and Scorer), over grpc.aio channels from `make_channel`: every call has a deadline and the
idempotent ones (GetInfo, ListAdapters, GetProblems, Score) retry on UNAVAILABLE.

Errors while checking a request keep their meaning for the caller (a dataset the reward service
refuses is INVALID_ARGUMENT, an unreachable peer UNAVAILABLE); errors while running become the
evaluation's one-line cause, naming the service, its address and the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc

from rlvr.common.client import make_channel
from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound, RlvrServiceError, Unavailable
from rlvr.jobspec import REWARD_FUNCTIONS
from rlvr.tasks import Message, Problem
from rlvr.transfer import adapter_upload
from rlvr.v1 import common_pb2, reward_pb2, reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from services.benchmark.catalog import RewardName
from services.benchmark.planning import RolloutModel
from services.benchmark.runner import AdapterTag, Answer, EvaluationError, Question, Sampling, Score

CODES: dict[grpc.StatusCode, type[RlvrServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


def checking_error(e: grpc.aio.AioRpcError, service: str, address: str) -> Exception:
    """A peer's refusal while a request is checked, as the same kind of error for our caller."""
    details = e.details() or e.code().name
    if e.code() in CODES:
        return CODES[e.code()](details)
    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(f"the {service} service at {address} is unreachable ({e.code().name}: {details})")
    return RuntimeError(f"the {service} service at {address}: {e.code().name}: {details}")


def running_error(e: grpc.aio.AioRpcError, service: str, address: str, call: str) -> EvaluationError:
    return EvaluationError(f"{service} service at {address}: {call} failed: {e.code().name}: "
                           f"{' '.join((e.details() or '').split())}")


class ServicePeers:
    """planning.Peers over gRPC; also the Generator and the Scorer of the runner."""

    def __init__(self, rollout_address: str, reward_address: str, *, generate_timeout_s: float = 600.0,
                 score_timeout_s: float = 300.0, upload_timeout_s: float = 300.0) -> None:
        self.rollout_address = rollout_address
        self.reward_address = reward_address
        self.generate_timeout_s = generate_timeout_s
        self.score_timeout_s = score_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self._rollout_channel = make_channel(rollout_address, aio=True)
        self._reward_channel = make_channel(reward_address, aio=True)
        self.rollout = rollout_pb2_grpc.RolloutServiceStub(self._rollout_channel)
        self.reward = reward_pb2_grpc.RewardServiceStub(self._reward_channel)
        self.generator = self
        self.scorer = self

    async def close(self) -> None:
        await self._rollout_channel.close()
        await self._reward_channel.close()

    # ------------------------------------------------------------------ checks (planning.Peers)

    async def rollout_model(self) -> RolloutModel:
        try:
            info = await self.rollout.GetInfo(rollout_pb2.GetInfoRequest())
        except grpc.aio.AioRpcError as e:
            raise checking_error(e, "rollout", self.rollout_address) from None
        return RolloutModel(model=info.model, max_model_len=info.max_model_len, address=self.rollout_address)

    async def live_adapters(self) -> dict[str, int]:
        try:
            response = await self.rollout.ListAdapters(rollout_pb2.ListAdaptersRequest())
        except grpc.aio.AioRpcError as e:
            raise checking_error(e, "rollout", self.rollout_address) from None
        return {a.name: a.version for a in response.adapters}

    async def upload_adapter(self, name: str, version: int, directory: Path) -> int:
        # Read in a worker thread: an adapter can be hundreds of MB and the event loop serves calls.
        messages = await asyncio.to_thread(list, adapter_upload(name, version, directory))

        async def stream() -> AsyncIterator[rollout_pb2.LoadAdapterRequest]:
            for message in messages:
                yield message

        try:
            info = await self.rollout.LoadAdapter(stream(), timeout=self.upload_timeout_s)
        except grpc.aio.AioRpcError as e:
            raise checking_error(e, "rollout", self.rollout_address) from None
        return info.version

    async def problems(self, function: RewardName, limit: int, dataset: str, split: str) -> list[Problem]:
        request = reward_pb2.GetProblemsRequest(function=REWARD_FUNCTIONS[function], split=reward_pb2.PROBLEM_SPLIT_HELDOUT,
                                                limit=limit, dataset=dataset, dataset_split=split)
        try:
            response = await self.reward.GetProblems(request)
        except grpc.aio.AioRpcError as e:
            raise checking_error(e, "reward", self.reward_address) from None
        return [
            Problem(id=p.id, task=function, question=p.question, ground_truth=p.ground_truth,
                    compact=p.compact or None,
                    messages=tuple(Message(m.role, m.content) for m in p.messages) or None)
            for p in response.problems
        ]

    # ------------------------------------------------------------------ the run (Generator, Scorer)

    async def generate(self, questions: Sequence[Question], sampling: Sampling, adapter: AdapterTag) -> list[Answer]:
        request = rollout_pb2.GenerateRequest(
            prompts=[
                rollout_pb2.Prompt(messages=rollout_pb2.ChatMessages(
                    messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in q.messages]))
                for q in questions
            ],
            n=1,
            sampling=common_pb2.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                               seed=sampling.seed, max_tokens=sampling.max_tokens),
            # An explicit version: the rollout service refuses rather than answer with another one.
            adapter=common_pb2.AdapterSelector(name=adapter.name, version=adapter.version),
            request_id=f"benchmark-q{questions[0].index}",
        )
        answers: list[Answer] = []
        try:
            async for response in self.rollout.Generate(request, timeout=self.generate_timeout_s):
                for c in response.completions:
                    if not 0 <= c.prompt_index < len(questions):
                        raise EvaluationError(f"rollout service at {self.rollout_address} answered prompt "
                                              f"{c.prompt_index} of {len(questions)}")
                    reason = "LENGTH" if c.finish_reason == common_pb2.FINISH_REASON_LENGTH else "STOP"
                    answers.append(Answer(questions[c.prompt_index].index, c.text, reason,
                                          AdapterTag(c.adapter_name, c.adapter_version)))
        except grpc.aio.AioRpcError as e:
            raise running_error(e, "rollout", self.rollout_address, "Generate") from None
        return answers

    async def score(self, function: RewardName, items: Sequence[tuple[str, str]]) -> list[Score]:
        request = reward_pb2.ScoreRequest(
            function=REWARD_FUNCTIONS[function],
            items=[reward_pb2.ScoreItem(completion=c, ground_truth=g) for c, g in items],
        )
        try:
            response = await self.reward.Score(request, timeout=self.score_timeout_s)
        except grpc.aio.AioRpcError as e:
            raise running_error(e, "reward", self.reward_address, "Score") from None
        return [Score(r.reward, r.accuracy, r.format, r.strict, r.extracted_answer) for r in response.results]
