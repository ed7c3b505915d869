import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from rlvr.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EvaluationStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVALUATION_STATUS_UNSPECIFIED: _ClassVar[EvaluationStatus]
    EVALUATION_STATUS_QUEUED: _ClassVar[EvaluationStatus]
    EVALUATION_STATUS_RUNNING: _ClassVar[EvaluationStatus]
    EVALUATION_STATUS_COMPLETED: _ClassVar[EvaluationStatus]
    EVALUATION_STATUS_FAILED: _ClassVar[EvaluationStatus]
    EVALUATION_STATUS_CANCELLED: _ClassVar[EvaluationStatus]
EVALUATION_STATUS_UNSPECIFIED: EvaluationStatus
EVALUATION_STATUS_QUEUED: EvaluationStatus
EVALUATION_STATUS_RUNNING: EvaluationStatus
EVALUATION_STATUS_COMPLETED: EvaluationStatus
EVALUATION_STATUS_FAILED: EvaluationStatus
EVALUATION_STATUS_CANCELLED: EvaluationStatus

class BenchmarkInfo(_message.Message):
    __slots__ = ("name", "display_name", "description", "size", "score_columns", "default_score_column", "needs_dataset", "reward_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SCORE_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_SCORE_COLUMN_FIELD_NUMBER: _ClassVar[int]
    NEEDS_DATASET_FIELD_NUMBER: _ClassVar[int]
    REWARD_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    display_name: str
    description: str
    size: int
    score_columns: _containers.RepeatedScalarFieldContainer[str]
    default_score_column: str
    needs_dataset: bool
    reward_key: str
    def __init__(self, name: _Optional[str] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., size: _Optional[int] = ..., score_columns: _Optional[_Iterable[str]] = ..., default_score_column: _Optional[str] = ..., needs_dataset: _Optional[bool] = ..., reward_key: _Optional[str] = ...) -> None: ...

class ListBenchmarksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBenchmarksResponse(_message.Message):
    __slots__ = ("benchmarks",)
    BENCHMARKS_FIELD_NUMBER: _ClassVar[int]
    benchmarks: _containers.RepeatedCompositeFieldContainer[BenchmarkInfo]
    def __init__(self, benchmarks: _Optional[_Iterable[_Union[BenchmarkInfo, _Mapping]]] = ...) -> None: ...

class ScoreBreakdown(_message.Message):
    __slots__ = ("score", "accuracy", "accuracy_strict", "format", "answered", "score_column")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_STRICT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    SCORE_COLUMN_FIELD_NUMBER: _ClassVar[int]
    score: float
    accuracy: float
    accuracy_strict: float
    format: float
    answered: float
    score_column: str
    def __init__(self, score: _Optional[float] = ..., accuracy: _Optional[float] = ..., accuracy_strict: _Optional[float] = ..., format: _Optional[float] = ..., answered: _Optional[float] = ..., score_column: _Optional[str] = ...) -> None: ...

class RunEvaluationRequest(_message.Message):
    __slots__ = ("model", "adapter", "benchmark", "limit", "seed", "sampling", "dataset", "dataset_split", "label", "adapter_path", "environment")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_PATH_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    model: str
    adapter: _common_pb2.AdapterSelector
    benchmark: str
    limit: int
    seed: int
    sampling: _common_pb2.SamplingParams
    dataset: str
    dataset_split: str
    label: str
    adapter_path: str
    environment: _common_pb2.EnvironmentConfig
    def __init__(self, model: _Optional[str] = ..., adapter: _Optional[_Union[_common_pb2.AdapterSelector, _Mapping]] = ..., benchmark: _Optional[str] = ..., limit: _Optional[int] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., dataset: _Optional[str] = ..., dataset_split: _Optional[str] = ..., label: _Optional[str] = ..., adapter_path: _Optional[str] = ..., environment: _Optional[_Union[_common_pb2.EnvironmentConfig, _Mapping]] = ...) -> None: ...

class EpisodeCounters(_message.Message):
    __slots__ = ("episodes", "turns_mean", "tool_calls", "tool_errors", "failed_episodes", "truncated_episodes")
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    TURNS_MEAN_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    FAILED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    episodes: int
    turns_mean: float
    tool_calls: int
    tool_errors: int
    failed_episodes: int
    truncated_episodes: int
    def __init__(self, episodes: _Optional[int] = ..., turns_mean: _Optional[float] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., failed_episodes: _Optional[int] = ..., truncated_episodes: _Optional[int] = ...) -> None: ...

class Evaluation(_message.Message):
    __slots__ = ("id", "model", "adapter_name", "adapter_version", "benchmark", "status", "scores", "questions_total", "questions_done", "created_at", "started_at", "finished_at", "error", "seed", "sampling", "label", "generate_seconds", "score_seconds", "question_set", "dataset", "dataset_split", "environment", "episodes")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_DONE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    GENERATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUESTION_SET_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    adapter_name: str
    adapter_version: int
    benchmark: str
    status: EvaluationStatus
    scores: ScoreBreakdown
    questions_total: int
    questions_done: int
    created_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error: str
    seed: int
    sampling: _common_pb2.SamplingParams
    label: str
    generate_seconds: float
    score_seconds: float
    question_set: str
    dataset: str
    dataset_split: str
    environment: _common_pb2.EnvironmentConfig
    episodes: EpisodeCounters
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., adapter_name: _Optional[str] = ..., adapter_version: _Optional[int] = ..., benchmark: _Optional[str] = ..., status: _Optional[_Union[EvaluationStatus, str]] = ..., scores: _Optional[_Union[ScoreBreakdown, _Mapping]] = ..., questions_total: _Optional[int] = ..., questions_done: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., label: _Optional[str] = ..., generate_seconds: _Optional[float] = ..., score_seconds: _Optional[float] = ..., question_set: _Optional[str] = ..., dataset: _Optional[str] = ..., dataset_split: _Optional[str] = ..., environment: _Optional[_Union[_common_pb2.EnvironmentConfig, _Mapping]] = ..., episodes: _Optional[_Union[EpisodeCounters, _Mapping]] = ...) -> None: ...

class GetEvaluationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListEvaluationsRequest(_message.Message):
    __slots__ = ("benchmark", "limit", "offset")
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    benchmark: str
    limit: int
    offset: int
    def __init__(self, benchmark: _Optional[str] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListEvaluationsResponse(_message.Message):
    __slots__ = ("evaluations", "total")
    EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    evaluations: _containers.RepeatedCompositeFieldContainer[Evaluation]
    total: int
    def __init__(self, evaluations: _Optional[_Iterable[_Union[Evaluation, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class CancelEvaluationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteEvaluationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteEvaluationResponse(_message.Message):
    __slots__ = ("id", "results_deleted")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    id: str
    results_deleted: int
    def __init__(self, id: _Optional[str] = ..., results_deleted: _Optional[int] = ...) -> None: ...

class QuestionResult(_message.Message):
    __slots__ = ("index", "prompt", "ground_truth", "completion", "extracted_answer", "reward", "accuracy", "format", "strict", "finish_reason", "episode")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    EXTRACTED_ANSWER_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    index: int
    prompt: str
    ground_truth: str
    completion: str
    extracted_answer: str
    reward: float
    accuracy: float
    format: float
    strict: bool
    finish_reason: _common_pb2.FinishReason
    episode: str
    def __init__(self, index: _Optional[int] = ..., prompt: _Optional[str] = ..., ground_truth: _Optional[str] = ..., completion: _Optional[str] = ..., extracted_answer: _Optional[str] = ..., reward: _Optional[float] = ..., accuracy: _Optional[float] = ..., format: _Optional[float] = ..., strict: _Optional[bool] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., episode: _Optional[str] = ...) -> None: ...

class GetEvaluationResultsRequest(_message.Message):
    __slots__ = ("id", "only_wrong", "offset", "limit")
    ID_FIELD_NUMBER: _ClassVar[int]
    ONLY_WRONG_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    id: str
    only_wrong: bool
    offset: int
    limit: int
    def __init__(self, id: _Optional[str] = ..., only_wrong: _Optional[bool] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetEvaluationResultsResponse(_message.Message):
    __slots__ = ("results", "total")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[QuestionResult]
    total: int
    def __init__(self, results: _Optional[_Iterable[_Union[QuestionResult, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class WatchEvaluationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class EvaluationEvent(_message.Message):
    __slots__ = ("evaluation_id", "status", "questions_done", "questions_total", "scores", "message")
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_DONE_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    status: EvaluationStatus
    questions_done: int
    questions_total: int
    scores: ScoreBreakdown
    message: str
    def __init__(self, evaluation_id: _Optional[str] = ..., status: _Optional[_Union[EvaluationStatus, str]] = ..., questions_done: _Optional[int] = ..., questions_total: _Optional[int] = ..., scores: _Optional[_Union[ScoreBreakdown, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class GetLeaderboardRequest(_message.Message):
    __slots__ = ("benchmark", "score_column", "limit", "question_set")
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    SCORE_COLUMN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    QUESTION_SET_FIELD_NUMBER: _ClassVar[int]
    benchmark: str
    score_column: str
    limit: int
    question_set: str
    def __init__(self, benchmark: _Optional[str] = ..., score_column: _Optional[str] = ..., limit: _Optional[int] = ..., question_set: _Optional[str] = ...) -> None: ...

class LeaderboardEntry(_message.Message):
    __slots__ = ("rank", "evaluation_id", "model", "adapter_name", "adapter_version", "scores", "label", "finished_at", "question_set", "questions", "standard_error")
    RANK_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    QUESTION_SET_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    STANDARD_ERROR_FIELD_NUMBER: _ClassVar[int]
    rank: int
    evaluation_id: str
    model: str
    adapter_name: str
    adapter_version: int
    scores: ScoreBreakdown
    label: str
    finished_at: _timestamp_pb2.Timestamp
    question_set: str
    questions: int
    standard_error: float
    def __init__(self, rank: _Optional[int] = ..., evaluation_id: _Optional[str] = ..., model: _Optional[str] = ..., adapter_name: _Optional[str] = ..., adapter_version: _Optional[int] = ..., scores: _Optional[_Union[ScoreBreakdown, _Mapping]] = ..., label: _Optional[str] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., question_set: _Optional[str] = ..., questions: _Optional[int] = ..., standard_error: _Optional[float] = ...) -> None: ...

class QuestionSet(_message.Message):
    __slots__ = ("id", "questions", "description", "entries")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    id: str
    questions: int
    description: str
    entries: int
    def __init__(self, id: _Optional[str] = ..., questions: _Optional[int] = ..., description: _Optional[str] = ..., entries: _Optional[int] = ...) -> None: ...

class GetLeaderboardResponse(_message.Message):
    __slots__ = ("benchmark", "score_column", "entries", "question_sets")
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    SCORE_COLUMN_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    QUESTION_SETS_FIELD_NUMBER: _ClassVar[int]
    benchmark: str
    score_column: str
    entries: _containers.RepeatedCompositeFieldContainer[LeaderboardEntry]
    question_sets: _containers.RepeatedCompositeFieldContainer[QuestionSet]
    def __init__(self, benchmark: _Optional[str] = ..., score_column: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[LeaderboardEntry, _Mapping]]] = ..., question_sets: _Optional[_Iterable[_Union[QuestionSet, _Mapping]]] = ...) -> None: ...
