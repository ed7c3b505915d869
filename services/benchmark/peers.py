"""The rollout and reward services as the evaluation core sees them (planning.Peers, runner's
Generator and Scorer), over the typed asyncio clients of rlvr.peers: every call has a deadline, the
idempotent ones (GetInfo, ListAdapters, GetProblems, Score) retry on UNAVAILABLE, and a failed call
is an `RlvrError` that `failure` translates, in one place:

- while a request is checked, a refusal keeps its meaning for our caller (a dataset the reward
  service refuses is INVALID_ARGUMENT, an unreachable peer UNAVAILABLE);
- while an evaluation runs, it becomes the evaluation's one-line cause, naming the service, its
  address and the call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc

from rlvr.common.auth import ChannelAuth
from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound, RlvrServiceError, Unavailable
from rlvr.jobspec import REWARD_FUNCTIONS
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncRewardClient, AsyncRolloutClient
from rlvr.peers.types import AdapterTag, Sampling, Score, chat_prompt, generate_request, score_request
from rlvr.tasks import Message, Problem
from rlvr.v1 import common_pb2, reward_pb2
from services.benchmark.catalog import RewardName
from services.benchmark.planning import RolloutModel
from services.benchmark.runner import Answer, EvaluationError, FinishReason, Generator, Question, Scorer

CODES: dict[grpc.StatusCode, type[RlvrServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


def failure(e: RlvrError, *, running: bool) -> Exception:
    """A peer's failed call as our own error: the evaluation's cause while `running`, else (while a
    request is checked) the same kind of error for our caller."""
    if running:
        return EvaluationError(e.describe())
    details = e.details or e.code.name
    if e.code in CODES:
        return CODES[e.code](details)
    if e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(f"the {e.service} service at {e.address} is unreachable ({e.code.name}: {details})")
    return RuntimeError(f"the {e.service} service at {e.address}: {e.code.name}: {details}")


@contextmanager
def translated(*, running: bool = False) -> Iterator[None]:
    try:
        yield
    except RlvrError as e:
        raise failure(e, running=running) from None


class ServicePeers:
    """planning.Peers over gRPC; also the Generator and the Scorer of the runner. Create it inside
    the event loop that uses it (grpc.aio channels belong to one loop)."""

    def __init__(self, rollout_address: str, reward_address: str, *, generate_timeout_s: float = 600.0,
                 score_timeout_s: float = 300.0, upload_timeout_s: float = 300.0,
                 auth: ChannelAuth | None = None) -> None:
        self.rollout_address = rollout_address
        self.reward_address = reward_address
        self.generate_timeout_s = generate_timeout_s
        self.score_timeout_s = score_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self.rollout = AsyncRolloutClient(rollout_address, auth=auth)
        self.reward = AsyncRewardClient(reward_address, auth=auth)
        self.generator: Generator = self  # planning.Peers declares these as the protocols
        self.scorer: Scorer = self

    async def close(self) -> None:
        await self.rollout.close()
        await self.reward.close()

    # ------------------------------------------------------------------ checks (planning.Peers)

    async def rollout_model(self) -> RolloutModel:
        with translated():
            info = await self.rollout.get_info()
        return RolloutModel(model=info.model, max_model_len=info.max_model_len, address=self.rollout_address)

    async def live_adapters(self) -> dict[str, int]:
        with translated():
            response = await self.rollout.list_adapters()
        return {a.name: a.version for a in response.adapters}

    async def upload_adapter(self, name: str, version: int, directory: Path) -> int:
        # The files are read in a worker thread, a chunk at a time: an adapter can be hundreds of
        # MB and the event loop serves calls meanwhile.
        with translated():
            info = await self.rollout.load_adapter(name, version, directory, timeout=self.upload_timeout_s)
        return info.version

    async def problems(self, function: RewardName, limit: int, dataset: str, split: str) -> list[Problem]:
        request = reward_pb2.GetProblemsRequest(function=REWARD_FUNCTIONS[function], split=reward_pb2.PROBLEM_SPLIT_HELDOUT,
                                                limit=limit, dataset=dataset, dataset_split=split)
        with translated():
            response = await self.reward.get_problems(request)
        return [
            Problem(id=p.id, task=function, question=p.question, ground_truth=p.ground_truth,
                    compact=p.compact or None,
                    messages=tuple(Message(m.role, m.content) for m in p.messages) or None)
            for p in response.problems
        ]

    # ------------------------------------------------------------------ the run (Generator, Scorer)

    async def generate(self, questions: Sequence[Question], sampling: Sampling, adapter: AdapterTag) -> list[Answer]:
        # An explicit version: the rollout service refuses rather than answer with another one.
        request = generate_request([chat_prompt(q.messages) for q in questions], sampling, adapter,
                                   request_id=f"benchmark-q{questions[0].index}")
        answers: list[Answer] = []
        with translated(running=True):
            async with self.rollout.generate(request, timeout=self.generate_timeout_s) as stream:
                async for response in stream:
                    for c in response.completions:
                        if not 0 <= c.prompt_index < len(questions):
                            raise EvaluationError(f"rollout service at {self.rollout_address} answered prompt "
                                                  f"{c.prompt_index} of {len(questions)}")
                        reason: FinishReason = "LENGTH" if c.finish_reason == common_pb2.FINISH_REASON_LENGTH else "STOP"
                        answers.append(Answer(questions[c.prompt_index].index, c.text, reason, AdapterTag.of(c)))
        return answers

    async def score(self, function: RewardName, items: Sequence[tuple[str, str]]) -> list[Score]:
        with translated(running=True):
            response = await self.reward.score(score_request(function, items), timeout=self.score_timeout_s)
        return [Score.of(r) for r in response.results]
