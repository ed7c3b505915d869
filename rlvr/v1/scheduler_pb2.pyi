import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from rlvr.v1 import common_pb2 as _common_pb2
from rlvr.v1 import reward_pb2 as _reward_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrendDirection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TREND_DIRECTION_UNSPECIFIED: _ClassVar[TrendDirection]
    TREND_DIRECTION_RISING: _ClassVar[TrendDirection]
    TREND_DIRECTION_FALLING: _ClassVar[TrendDirection]
    TREND_DIRECTION_FLAT: _ClassVar[TrendDirection]

class ExportFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPORT_FORMAT_UNSPECIFIED: _ClassVar[ExportFormat]
    EXPORT_FORMAT_CSV: _ClassVar[ExportFormat]
    EXPORT_FORMAT_JSONL: _ClassVar[ExportFormat]

class LoopStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOOP_STATUS_UNSPECIFIED: _ClassVar[LoopStatus]
    LOOP_STATUS_QUEUED: _ClassVar[LoopStatus]
    LOOP_STATUS_TRAINING: _ClassVar[LoopStatus]
    LOOP_STATUS_BENCHMARKING: _ClassVar[LoopStatus]
    LOOP_STATUS_TARGET_REACHED: _ClassVar[LoopStatus]
    LOOP_STATUS_ROUNDS_SPENT: _ClassVar[LoopStatus]
    LOOP_STATUS_PLATEAUED: _ClassVar[LoopStatus]
    LOOP_STATUS_FAILED: _ClassVar[LoopStatus]
    LOOP_STATUS_STOPPED: _ClassVar[LoopStatus]

class RoundStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUND_STATUS_UNSPECIFIED: _ClassVar[RoundStatus]
    ROUND_STATUS_TRAINING: _ClassVar[RoundStatus]
    ROUND_STATUS_BENCHMARKING: _ClassVar[RoundStatus]
    ROUND_STATUS_SCORED: _ClassVar[RoundStatus]
    ROUND_STATUS_FAILED: _ClassVar[RoundStatus]
    ROUND_STATUS_STOPPED: _ClassVar[RoundStatus]
TREND_DIRECTION_UNSPECIFIED: TrendDirection
TREND_DIRECTION_RISING: TrendDirection
TREND_DIRECTION_FALLING: TrendDirection
TREND_DIRECTION_FLAT: TrendDirection
EXPORT_FORMAT_UNSPECIFIED: ExportFormat
EXPORT_FORMAT_CSV: ExportFormat
EXPORT_FORMAT_JSONL: ExportFormat
LOOP_STATUS_UNSPECIFIED: LoopStatus
LOOP_STATUS_QUEUED: LoopStatus
LOOP_STATUS_TRAINING: LoopStatus
LOOP_STATUS_BENCHMARKING: LoopStatus
LOOP_STATUS_TARGET_REACHED: LoopStatus
LOOP_STATUS_ROUNDS_SPENT: LoopStatus
LOOP_STATUS_PLATEAUED: LoopStatus
LOOP_STATUS_FAILED: LoopStatus
LOOP_STATUS_STOPPED: LoopStatus
ROUND_STATUS_UNSPECIFIED: RoundStatus
ROUND_STATUS_TRAINING: RoundStatus
ROUND_STATUS_BENCHMARKING: RoundStatus
ROUND_STATUS_SCORED: RoundStatus
ROUND_STATUS_FAILED: RoundStatus
ROUND_STATUS_STOPPED: RoundStatus

class CreateJobRequest(_message.Message):
    __slots__ = ("spec", "dry_run")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.JobSpec
    dry_run: bool
    def __init__(self, spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CreateJobResponse(_message.Message):
    __slots__ = ("job", "summary", "warnings", "resolved_spec")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_SPEC_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    summary: _common_pb2.TrainingSummary
    warnings: _containers.RepeatedScalarFieldContainer[str]
    resolved_spec: _common_pb2.JobSpec
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ..., summary: _Optional[_Union[_common_pb2.TrainingSummary, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ..., resolved_spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("status", "limit", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.JobStatus
    limit: int
    offset: int
    def __init__(self, status: _Optional[_Union[_common_pb2.JobStatus, str]] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "total")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Job]
    total: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[_common_pb2.Job, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ("id", "freed_bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    freed_bytes: int
    def __init__(self, id: _Optional[str] = ..., freed_bytes: _Optional[int] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("id", "from_start")
    ID_FIELD_NUMBER: _ClassVar[int]
    FROM_START_FIELD_NUMBER: _ClassVar[int]
    id: str
    from_start: bool
    def __init__(self, id: _Optional[str] = ..., from_start: _Optional[bool] = ...) -> None: ...

class Trend(_message.Message):
    __slots__ = ("early", "late", "delta", "direction", "peak", "peak_step", "window")
    EARLY_FIELD_NUMBER: _ClassVar[int]
    LATE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    PEAK_FIELD_NUMBER: _ClassVar[int]
    PEAK_STEP_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    early: float
    late: float
    delta: float
    direction: TrendDirection
    peak: float
    peak_step: int
    window: int
    def __init__(self, early: _Optional[float] = ..., late: _Optional[float] = ..., delta: _Optional[float] = ..., direction: _Optional[_Union[TrendDirection, str]] = ..., peak: _Optional[float] = ..., peak_step: _Optional[int] = ..., window: _Optional[int] = ...) -> None: ...

class StatTiles(_message.Message):
    __slots__ = ("steps", "final_reward", "best_reward", "best_accuracy", "final_loss", "max_policy_lag")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    FINAL_REWARD_FIELD_NUMBER: _ClassVar[int]
    BEST_REWARD_FIELD_NUMBER: _ClassVar[int]
    BEST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    FINAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    MAX_POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    steps: int
    final_reward: float
    best_reward: float
    best_accuracy: float
    final_loss: float
    max_policy_lag: int
    def __init__(self, steps: _Optional[int] = ..., final_reward: _Optional[float] = ..., best_reward: _Optional[float] = ..., best_accuracy: _Optional[float] = ..., final_loss: _Optional[float] = ..., max_policy_lag: _Optional[int] = ...) -> None: ...

class SeriesPoint(_message.Message):
    __slots__ = ("step", "reward", "accuracy", "loss", "kl", "entropy", "completion_length", "format", "policy_lag", "reward_components", "reward_errors", "turns_mean", "tool_calls", "tool_errors", "heldout_accuracy", "token_accuracy", "heldout_loss", "heldout_f1")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    TURNS_MEAN_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_LOSS_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_F1_FIELD_NUMBER: _ClassVar[int]
    step: int
    reward: float
    accuracy: float
    loss: float
    kl: float
    entropy: float
    completion_length: float
    format: float
    policy_lag: int
    reward_components: _containers.ScalarMap[str, float]
    reward_errors: int
    turns_mean: float
    tool_calls: int
    tool_errors: int
    heldout_accuracy: float
    token_accuracy: float
    heldout_loss: float
    heldout_f1: float
    def __init__(self, step: _Optional[int] = ..., reward: _Optional[float] = ..., accuracy: _Optional[float] = ..., loss: _Optional[float] = ..., kl: _Optional[float] = ..., entropy: _Optional[float] = ..., completion_length: _Optional[float] = ..., format: _Optional[float] = ..., policy_lag: _Optional[int] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., reward_errors: _Optional[int] = ..., turns_mean: _Optional[float] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., heldout_accuracy: _Optional[float] = ..., token_accuracy: _Optional[float] = ..., heldout_loss: _Optional[float] = ..., heldout_f1: _Optional[float] = ...) -> None: ...

class GetJobMetricsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobMetrics(_message.Message):
    __slots__ = ("job_id", "status", "has_steps", "message", "accuracy_trend", "reward_trend", "tiles", "series", "has_kl", "has_entropy", "has_episodes", "supervised", "head")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HAS_STEPS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_TREND_FIELD_NUMBER: _ClassVar[int]
    REWARD_TREND_FIELD_NUMBER: _ClassVar[int]
    TILES_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    HAS_KL_FIELD_NUMBER: _ClassVar[int]
    HAS_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    HAS_EPISODES_FIELD_NUMBER: _ClassVar[int]
    SUPERVISED_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: _common_pb2.JobStatus
    has_steps: bool
    message: str
    accuracy_trend: Trend
    reward_trend: Trend
    tiles: StatTiles
    series: _containers.RepeatedCompositeFieldContainer[SeriesPoint]
    has_kl: bool
    has_entropy: bool
    has_episodes: bool
    supervised: bool
    head: bool
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.JobStatus, str]] = ..., has_steps: _Optional[bool] = ..., message: _Optional[str] = ..., accuracy_trend: _Optional[_Union[Trend, _Mapping]] = ..., reward_trend: _Optional[_Union[Trend, _Mapping]] = ..., tiles: _Optional[_Union[StatTiles, _Mapping]] = ..., series: _Optional[_Iterable[_Union[SeriesPoint, _Mapping]]] = ..., has_kl: _Optional[bool] = ..., has_entropy: _Optional[bool] = ..., has_episodes: _Optional[bool] = ..., supervised: _Optional[bool] = ..., head: _Optional[bool] = ...) -> None: ...

class GetJobSamplesRequest(_message.Message):
    __slots__ = ("job_id", "step", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetJobSamplesResponse(_message.Message):
    __slots__ = ("job_id", "steps", "environment")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    steps: _containers.RepeatedCompositeFieldContainer[_common_pb2.CompletionSamples]
    environment: str
    def __init__(self, job_id: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[_common_pb2.CompletionSamples, _Mapping]]] = ..., environment: _Optional[str] = ...) -> None: ...

class DownloadAdapterRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class MergeModelRequest(_message.Message):
    __slots__ = ("job_id", "dtype")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    dtype: str
    def __init__(self, job_id: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...

class MergeModelProgress(_message.Message):
    __slots__ = ("stage", "fraction", "done", "path", "size_bytes")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    stage: str
    fraction: float
    done: bool
    path: str
    size_bytes: int
    def __init__(self, stage: _Optional[str] = ..., fraction: _Optional[float] = ..., done: _Optional[bool] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class DownloadMergedModelRequest(_message.Message):
    __slots__ = ("job_id", "dtype")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    dtype: str
    def __init__(self, job_id: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...

class ExportHistoryRequest(_message.Message):
    __slots__ = ("job_id", "format")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    format: ExportFormat
    def __init__(self, job_id: _Optional[str] = ..., format: _Optional[_Union[ExportFormat, str]] = ...) -> None: ...

class ExportHistoryResponse(_message.Message):
    __slots__ = ("content", "content_type", "rows", "filename")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    content_type: str
    rows: int
    filename: str
    def __init__(self, content: _Optional[bytes] = ..., content_type: _Optional[str] = ..., rows: _Optional[int] = ..., filename: _Optional[str] = ...) -> None: ...

class LoopSpec(_message.Message):
    __slots__ = ("name", "job", "benchmark", "score_column", "target", "max_rounds", "give_up_after", "reclaim_storage", "benchmark_limit", "min_gain", "benchmark_dataset", "benchmark_dataset_split", "best_step")
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    SCORE_COLUMN_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MAX_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    GIVE_UP_AFTER_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_STORAGE_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_GAIN_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_DATASET_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_DATASET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    BEST_STEP_FIELD_NUMBER: _ClassVar[int]
    name: str
    job: _common_pb2.JobSpec
    benchmark: str
    score_column: str
    target: float
    max_rounds: int
    give_up_after: int
    reclaim_storage: bool
    benchmark_limit: int
    min_gain: float
    benchmark_dataset: str
    benchmark_dataset_split: str
    best_step: bool
    def __init__(self, name: _Optional[str] = ..., job: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., benchmark: _Optional[str] = ..., score_column: _Optional[str] = ..., target: _Optional[float] = ..., max_rounds: _Optional[int] = ..., give_up_after: _Optional[int] = ..., reclaim_storage: _Optional[bool] = ..., benchmark_limit: _Optional[int] = ..., min_gain: _Optional[float] = ..., benchmark_dataset: _Optional[str] = ..., benchmark_dataset_split: _Optional[str] = ..., best_step: _Optional[bool] = ...) -> None: ...

class Round(_message.Message):
    __slots__ = ("index", "job_id", "evaluation_id", "status", "score", "delta", "best", "duration_seconds", "started_at", "finished_at", "adapter", "training_seconds", "benchmarking_seconds", "reclaimed_bytes", "error", "real_gain", "gain_threshold", "base_round", "current_step", "total_steps", "adapter_step")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    BEST_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TRAINING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BENCHMARKING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RECLAIMED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REAL_GAIN_FIELD_NUMBER: _ClassVar[int]
    GAIN_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BASE_ROUND_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_STEP_FIELD_NUMBER: _ClassVar[int]
    index: int
    job_id: str
    evaluation_id: str
    status: RoundStatus
    score: float
    delta: float
    best: bool
    duration_seconds: float
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    adapter: _common_pb2.AdapterRef
    training_seconds: float
    benchmarking_seconds: float
    reclaimed_bytes: int
    error: str
    real_gain: bool
    gain_threshold: float
    base_round: int
    current_step: int
    total_steps: int
    adapter_step: int
    def __init__(self, index: _Optional[int] = ..., job_id: _Optional[str] = ..., evaluation_id: _Optional[str] = ..., status: _Optional[_Union[RoundStatus, str]] = ..., score: _Optional[float] = ..., delta: _Optional[float] = ..., best: _Optional[bool] = ..., duration_seconds: _Optional[float] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ..., training_seconds: _Optional[float] = ..., benchmarking_seconds: _Optional[float] = ..., reclaimed_bytes: _Optional[int] = ..., error: _Optional[str] = ..., real_gain: _Optional[bool] = ..., gain_threshold: _Optional[float] = ..., base_round: _Optional[int] = ..., current_step: _Optional[int] = ..., total_steps: _Optional[int] = ..., adapter_step: _Optional[int] = ...) -> None: ...

class Loop(_message.Message):
    __slots__ = ("id", "spec", "status", "rounds", "best_score", "best_round", "gain_over_first", "elapsed_seconds", "created_at", "finished_at", "error", "baseline_score", "baseline_evaluation_id", "message", "started_at", "training_seconds", "benchmarking_seconds", "summary", "warnings")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BEST_SCORE_FIELD_NUMBER: _ClassVar[int]
    BEST_ROUND_FIELD_NUMBER: _ClassVar[int]
    GAIN_OVER_FIRST_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BASELINE_SCORE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    TRAINING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BENCHMARKING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: LoopSpec
    status: LoopStatus
    rounds: _containers.RepeatedCompositeFieldContainer[Round]
    best_score: float
    best_round: int
    gain_over_first: float
    elapsed_seconds: float
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error: str
    baseline_score: float
    baseline_evaluation_id: str
    message: str
    started_at: _timestamp_pb2.Timestamp
    training_seconds: float
    benchmarking_seconds: float
    summary: _common_pb2.TrainingSummary
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[LoopSpec, _Mapping]] = ..., status: _Optional[_Union[LoopStatus, str]] = ..., rounds: _Optional[_Iterable[_Union[Round, _Mapping]]] = ..., best_score: _Optional[float] = ..., best_round: _Optional[int] = ..., gain_over_first: _Optional[float] = ..., elapsed_seconds: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., baseline_score: _Optional[float] = ..., baseline_evaluation_id: _Optional[str] = ..., message: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., training_seconds: _Optional[float] = ..., benchmarking_seconds: _Optional[float] = ..., summary: _Optional[_Union[_common_pb2.TrainingSummary, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class LoopStatusEvent(_message.Message):
    __slots__ = ("loop_id", "status", "round", "message", "time", "score")
    LOOP_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    loop_id: str
    status: LoopStatus
    round: int
    message: str
    time: _timestamp_pb2.Timestamp
    score: float
    def __init__(self, loop_id: _Optional[str] = ..., status: _Optional[_Union[LoopStatus, str]] = ..., round: _Optional[int] = ..., message: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., score: _Optional[float] = ...) -> None: ...

class CreateLoopRequest(_message.Message):
    __slots__ = ("spec", "dry_run")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    spec: LoopSpec
    dry_run: bool
    def __init__(self, spec: _Optional[_Union[LoopSpec, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CreateLoopResponse(_message.Message):
    __slots__ = ("loop", "resolved_spec", "summary", "warnings")
    LOOP_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_SPEC_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    loop: Loop
    resolved_spec: LoopSpec
    summary: _common_pb2.TrainingSummary
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, loop: _Optional[_Union[Loop, _Mapping]] = ..., resolved_spec: _Optional[_Union[LoopSpec, _Mapping]] = ..., summary: _Optional[_Union[_common_pb2.TrainingSummary, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class GetLoopRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListLoopsRequest(_message.Message):
    __slots__ = ("limit", "offset", "status")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    limit: int
    offset: int
    status: LoopStatus
    def __init__(self, limit: _Optional[int] = ..., offset: _Optional[int] = ..., status: _Optional[_Union[LoopStatus, str]] = ...) -> None: ...

class ListLoopsResponse(_message.Message):
    __slots__ = ("loops", "total")
    LOOPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    loops: _containers.RepeatedCompositeFieldContainer[Loop]
    total: int
    def __init__(self, loops: _Optional[_Iterable[_Union[Loop, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class StopLoopRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WatchLoopRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class TrackJobRequest(_message.Message):
    __slots__ = ("job_id", "trackers")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TRACKERS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    trackers: _containers.RepeatedCompositeFieldContainer[_common_pb2.TrackerConfig]
    def __init__(self, job_id: _Optional[str] = ..., trackers: _Optional[_Iterable[_Union[_common_pb2.TrackerConfig, _Mapping]]] = ...) -> None: ...

class TrackJobResponse(_message.Message):
    __slots__ = ("links",)
    LINKS_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[_common_pb2.TrackingLink]
    def __init__(self, links: _Optional[_Iterable[_Union[_common_pb2.TrackingLink, _Mapping]]] = ...) -> None: ...

class ListEnvironmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvironmentInfo(_message.Message):
    __slots__ = ("key", "display_name", "description", "version", "source", "tools", "columns", "max_turns", "default_benchmark", "instruction", "tool_timeout_seconds")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    TOOL_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    display_name: str
    description: str
    version: str
    source: str
    tools: _containers.RepeatedScalarFieldContainer[str]
    columns: _containers.RepeatedScalarFieldContainer[str]
    max_turns: int
    default_benchmark: str
    instruction: str
    tool_timeout_seconds: float
    def __init__(self, key: _Optional[str] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., version: _Optional[str] = ..., source: _Optional[str] = ..., tools: _Optional[_Iterable[str]] = ..., columns: _Optional[_Iterable[str]] = ..., max_turns: _Optional[int] = ..., default_benchmark: _Optional[str] = ..., instruction: _Optional[str] = ..., tool_timeout_seconds: _Optional[float] = ...) -> None: ...

class UnavailableEnvironment(_message.Message):
    __slots__ = ("key", "error")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    key: str
    error: str
    def __init__(self, key: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ListEnvironmentsResponse(_message.Message):
    __slots__ = ("environments", "unavailable")
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentInfo]
    unavailable: _containers.RepeatedCompositeFieldContainer[UnavailableEnvironment]
    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentInfo, _Mapping]]] = ..., unavailable: _Optional[_Iterable[_Union[UnavailableEnvironment, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "source", "architecture", "parameters", "vocab_size", "context_length", "dtype", "chat_template", "recipe", "recipe_source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    RECIPE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    architecture: str
    parameters: int
    vocab_size: int
    context_length: int
    dtype: str
    chat_template: bool
    recipe: _common_pb2.JobSpec
    recipe_source: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., architecture: _Optional[str] = ..., parameters: _Optional[int] = ..., vocab_size: _Optional[int] = ..., context_length: _Optional[int] = ..., dtype: _Optional[str] = ..., chat_template: _Optional[bool] = ..., recipe: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., recipe_source: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...
