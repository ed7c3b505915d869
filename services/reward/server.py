"""gRPC glue of the reward service: a thin shell over the pure scoring functions
(rlvr/rewards/scoring.py), the time-limited scoring pool (pool.py) and the tasks (rlvr/tasks).

Validation happens here, before any work; scoring runs in the pool's worker processes so a
pathological completion costs at most its time limit and never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import grpc

from rlvr.common.errors import InvalidArgument, Unavailable, bounded, map_errors, out_of_range, shown
from rlvr.jobspec import MAX_DATASET_CHARS, MAX_SPLIT_CHARS, REWARD_KEYS, REWARD_NAMES, SYNTHETIC_PROMPTS
from rlvr.services.common.server import GrpcService
from rlvr.services.reward.settings import RewardSettings
from rlvr.v1 import common_pb2, reward_pb2, reward_pb2_grpc

if TYPE_CHECKING:  # both are imported when first used
    from rlvr.rewards.scoring import ScoringFunction
    from rlvr.services.reward.pool import ScoringPool

# ListRewardFunctions: (display name from the spec, needs a dataset, description)
DISPLAY = {
    common_pb2.REWARD_FUNCTION_MATH_PAIRS: (REWARD_NAMES[common_pb2.REWARD_FUNCTION_MATH_PAIRS], False,
                                            "A self-generating arithmetic task: add adjacent pairs, multiply; "
                                            "the correct final number wins. No dataset needed."),
    common_pb2.REWARD_FUNCTION_GSM8K: (REWARD_NAMES[common_pb2.REWARD_FUNCTION_GSM8K], False,
                                       "Grade-school word problems from the built-in openai/gsm8k; "
                                       "rewards the correct final number. The Dataset field is ignored."),
    common_pb2.REWARD_FUNCTION_BOXED: (REWARD_NAMES[common_pb2.REWARD_FUNCTION_BOXED], True,
                                       "Any dataset with prompt and ground_truth columns; rewards a correct "
                                       "\\boxed{...} final answer."),
}


def function_name(value: int, field: str = "function") -> ScoringFunction:
    if value == common_pb2.REWARD_FUNCTION_UNSPECIFIED:
        return "math_pairs"
    if value not in REWARD_KEYS:  # the spec's keys are the scoring functions' names
        raise out_of_range(field, value, ", ".join(common_pb2.RewardFunction.Name(v) for v in REWARD_KEYS))
    return REWARD_KEYS[value]  # type: ignore[index]  # checked just above: a RewardFunction value


@map_errors
class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, settings: RewardSettings) -> None:
        self.settings = settings
        self._pool: ScoringPool | None = None

    def start(self) -> None:
        import os

        from rlvr.services.reward.pool import ScoringPool

        self._pool = ScoringPool(workers=max(1, min(4, os.cpu_count() or 1)))

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.close()

    async def Score(self, request: reward_pb2.ScoreRequest, context: grpc.aio.ServicerContext  # noqa: N802
                    ) -> reward_pb2.ScoreResponse:
        from rlvr.services.reward.pool import ScoreItem

        function = function_name(request.function)
        if len(request.items) > self.settings.max_batch:
            raise out_of_range("items", f"{len(request.items)} items", f"at most {self.settings.max_batch} a call")
        weight = request.format_bonus_weight if request.HasField("format_bonus_weight") else 0.1
        if not 0.0 <= weight <= 1.0:
            raise out_of_range("format_bonus_weight", weight, "0.0-1.0 (default 0.1)")
        timeout = request.timeout_seconds if request.HasField("timeout_seconds") else self.settings.timeout_seconds
        if not 0.001 <= timeout <= 10:
            raise out_of_range("timeout_seconds", timeout, "0.001-10 (default 0.5)")
        bonus = request.format_bonus if request.HasField("format_bonus") else True
        items = [ScoreItem(function, it.completion, it.ground_truth, bonus, weight) for it in request.items]
        if self._pool is None:  # the port is open before start() has made the pool
            raise Unavailable("the reward service is starting; retry")
        t0 = time.perf_counter()
        results = await asyncio.to_thread(self._pool.score_batch, items, timeout)
        return reward_pb2.ScoreResponse(
            results=[common_pb2.RewardComponents(reward=r.reward, accuracy=r.accuracy, format=r.format,
                                                 strict=r.strict, extracted_answer=r.extracted_answer or "",
                                                 timed_out=r.timed_out) for r in results],
            seconds=time.perf_counter() - t0,
        )

    async def GetProblems(self, request: reward_pb2.GetProblemsRequest, context: grpc.aio.ServicerContext  # noqa: N802
                          ) -> reward_pb2.GetProblemsResponse:
        from rlvr.tasks import TaskError, ignored_dataset_warning
        from rlvr.tasks.render import INSTRUCTIONS

        function = function_name(request.function)
        if request.split not in reward_pb2.ProblemSplit.values():
            raise out_of_range("split", request.split, ", ".join(f"{v} ({reward_pb2.ProblemSplit.Name(v)})"
                                                                 for v in reward_pb2.ProblemSplit.values()))
        bounded("dataset", request.dataset, MAX_DATASET_CHARS)
        bounded("dataset_split", request.dataset_split, MAX_SPLIT_CHARS)
        if request.limit < 0:
            raise out_of_range("limit", request.limit, ">= 0 (0 = all, or the task's default)")
        if function == "math_pairs" and request.limit:
            # Math Pairs makes its training problems (as many as asked, within the spec's range) and
            # has a fixed held-out pool: say which bound `limit` crossed, naming `limit`.
            from rlvr.tasks.math_pairs import all_heldout

            heldout = request.split == reward_pb2.PROBLEM_SPLIT_HELDOUT
            low, high = (1, len(all_heldout())) if heldout else (SYNTHETIC_PROMPTS.low, SYNTHETIC_PROMPTS.high)
            if not low <= request.limit <= high:
                what = "held-out problems" if heldout else "generated training problems"
                raise out_of_range("limit", request.limit, f"0 (the task's default) or {low}-{high} {what} "
                                                           "for Math Pairs")
        if function == "boxed" and not request.dataset.strip():
            raise InvalidArgument("dataset: required for Boxed-answer accuracy (a Hugging Face dataset name or "
                                  "a local JSONL/Parquet/CSV file with prompt and ground_truth columns)")
        try:
            problems = await asyncio.to_thread(self._problems, function, request)
        except TaskError as e:
            if function != "boxed":
                raise
            raise InvalidArgument(f"dataset: {e}") from None  # the data named by `dataset` cannot be read
        warning = ignored_dataset_warning(function, request.dataset)
        return reward_pb2.GetProblemsResponse(
            problems=[reward_pb2.Problem(id=p.id, question=p.question, ground_truth=p.ground_truth,
                                         compact=p.compact or "",
                                         messages=[common_pb2.ChatMessage(role=m.role, content=m.content)
                                                   for m in (p.messages or ())]) for p in problems],
            warnings=[warning] if warning else [], instruction=INSTRUCTIONS[function],
        )

    def _problems(self, function: str, request: reward_pb2.GetProblemsRequest) -> list:
        """The problems of the dataset split asked for: `dataset_split` (GSM8K and boxed datasets), by
        default "train" for the TRAIN split and, for HELDOUT, "test" (or a one-split dataset's only
        split, a single local file); Math Pairs makes both itself. TRAIN comes in a seeded order,
        HELDOUT in the data's own order."""
        from rlvr.tasks import get_task, heldout_split

        heldout = request.split == reward_pb2.PROBLEM_SPLIT_HELDOUT
        task = get_task(function, dataset=request.dataset or None, data_roots=self.settings.data_roots)
        if function == "math_pairs":
            split = "test" if heldout else "train"
        else:
            splits = task.splits()
            source = request.dataset.strip() if function == "boxed" else "openai/gsm8k"
            split = request.dataset_split.strip() or (heldout_split(splits, source) if heldout else "train")
            if split not in splits:
                raise InvalidArgument(f"dataset_split: {shown(split)} is not a split of {shown(source)}; it has: "
                                      f"{', '.join(splits)}")
        return task.prompts(n=request.limit or None, seed=request.seed, split=split, shuffle=not heldout)

    async def ListRewardFunctions(self, request, context):  # noqa: N802
        return reward_pb2.ListRewardFunctionsResponse(functions=[
            reward_pb2.RewardFunctionInfo(function=value, display_name=name, description=text, needs_dataset=needs)
            for value, (name, needs, text) in DISPLAY.items()
        ])


def build_service(settings: RewardSettings) -> GrpcService:
    servicer = RewardServicer(settings)
    name = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name
    return GrpcService([(reward_pb2_grpc.add_RewardServiceServicer_to_server, servicer, name)],
                       on_start=servicer.start, on_stop=servicer.stop)
