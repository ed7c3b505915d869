import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RewardFunction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REWARD_FUNCTION_UNSPECIFIED: _ClassVar[RewardFunction]
    REWARD_FUNCTION_MATH_PAIRS: _ClassVar[RewardFunction]
    REWARD_FUNCTION_GSM8K: _ClassVar[RewardFunction]
    REWARD_FUNCTION_BOXED: _ClassVar[RewardFunction]

class LossType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOSS_TYPE_UNSPECIFIED: _ClassVar[LossType]
    LOSS_TYPE_GRPO: _ClassVar[LossType]
    LOSS_TYPE_DAPO: _ClassVar[LossType]
    LOSS_TYPE_DR_GRPO: _ClassVar[LossType]
    LOSS_TYPE_GSPO: _ClassVar[LossType]
    LOSS_TYPE_CISPO: _ClassVar[LossType]
    LOSS_TYPE_SAPO: _ClassVar[LossType]

class TrainingMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINING_METHOD_UNSPECIFIED: _ClassVar[TrainingMethod]
    TRAINING_METHOD_RLVR: _ClassVar[TrainingMethod]
    TRAINING_METHOD_SFT: _ClassVar[TrainingMethod]
    TRAINING_METHOD_HEAD: _ClassVar[TrainingMethod]

class HeadTask(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEAD_TASK_UNSPECIFIED: _ClassVar[HeadTask]
    HEAD_TASK_CLASSIFICATION: _ClassVar[HeadTask]
    HEAD_TASK_REGRESSION: _ClassVar[HeadTask]

class Quantization(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUANTIZATION_UNSPECIFIED: _ClassVar[Quantization]
    QUANTIZATION_FULL: _ClassVar[Quantization]
    QUANTIZATION_4BIT: _ClassVar[Quantization]
    QUANTIZATION_8BIT: _ClassVar[Quantization]

class GenerationBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GENERATION_BACKEND_UNSPECIFIED: _ClassVar[GenerationBackend]
    GENERATION_BACKEND_VLLM: _ClassVar[GenerationBackend]
    GENERATION_BACKEND_TRANSFORMERS: _ClassVar[GenerationBackend]
    GENERATION_BACKEND_VLLM_COLOCATE: _ClassVar[GenerationBackend]

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_QUEUED: _ClassVar[JobStatus]
    JOB_STATUS_RUNNING: _ClassVar[JobStatus]
    JOB_STATUS_COMPLETED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]
    JOB_STATUS_CANCELLED: _ClassVar[JobStatus]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]

class TrackerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRACKER_KIND_UNSPECIFIED: _ClassVar[TrackerKind]
    TRACKER_KIND_TENSORBOARD: _ClassVar[TrackerKind]
    TRACKER_KIND_MLFLOW: _ClassVar[TrackerKind]
    TRACKER_KIND_WANDB: _ClassVar[TrackerKind]
    TRACKER_KIND_TRACKIO: _ClassVar[TrackerKind]
REWARD_FUNCTION_UNSPECIFIED: RewardFunction
REWARD_FUNCTION_MATH_PAIRS: RewardFunction
REWARD_FUNCTION_GSM8K: RewardFunction
REWARD_FUNCTION_BOXED: RewardFunction
LOSS_TYPE_UNSPECIFIED: LossType
LOSS_TYPE_GRPO: LossType
LOSS_TYPE_DAPO: LossType
LOSS_TYPE_DR_GRPO: LossType
LOSS_TYPE_GSPO: LossType
LOSS_TYPE_CISPO: LossType
LOSS_TYPE_SAPO: LossType
TRAINING_METHOD_UNSPECIFIED: TrainingMethod
TRAINING_METHOD_RLVR: TrainingMethod
TRAINING_METHOD_SFT: TrainingMethod
TRAINING_METHOD_HEAD: TrainingMethod
HEAD_TASK_UNSPECIFIED: HeadTask
HEAD_TASK_CLASSIFICATION: HeadTask
HEAD_TASK_REGRESSION: HeadTask
QUANTIZATION_UNSPECIFIED: Quantization
QUANTIZATION_FULL: Quantization
QUANTIZATION_4BIT: Quantization
QUANTIZATION_8BIT: Quantization
GENERATION_BACKEND_UNSPECIFIED: GenerationBackend
GENERATION_BACKEND_VLLM: GenerationBackend
GENERATION_BACKEND_TRANSFORMERS: GenerationBackend
GENERATION_BACKEND_VLLM_COLOCATE: GenerationBackend
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_QUEUED: JobStatus
JOB_STATUS_RUNNING: JobStatus
JOB_STATUS_COMPLETED: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_STATUS_CANCELLED: JobStatus
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
TRACKER_KIND_UNSPECIFIED: TrackerKind
TRACKER_KIND_TENSORBOARD: TrackerKind
TRACKER_KIND_MLFLOW: TrackerKind
TRACKER_KIND_WANDB: TrackerKind
TRACKER_KIND_TRACKIO: TrackerKind

class RewardConfig(_message.Message):
    __slots__ = ("function", "synthetic_prompts", "format_bonus", "format_bonus_weight", "dataset", "dataset_split", "key", "terms", "accuracy_key")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    SYNTHETIC_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_BONUS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_BONUS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TERMS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_KEY_FIELD_NUMBER: _ClassVar[int]
    function: RewardFunction
    synthetic_prompts: int
    format_bonus: bool
    format_bonus_weight: float
    dataset: str
    dataset_split: str
    key: str
    terms: _containers.RepeatedCompositeFieldContainer[RewardTerm]
    accuracy_key: str
    def __init__(self, function: _Optional[_Union[RewardFunction, str]] = ..., synthetic_prompts: _Optional[int] = ..., format_bonus: _Optional[bool] = ..., format_bonus_weight: _Optional[float] = ..., dataset: _Optional[str] = ..., dataset_split: _Optional[str] = ..., key: _Optional[str] = ..., terms: _Optional[_Iterable[_Union[RewardTerm, _Mapping]]] = ..., accuracy_key: _Optional[str] = ...) -> None: ...

class RewardTerm(_message.Message):
    __slots__ = ("key", "weight")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    key: str
    weight: float
    def __init__(self, key: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class GrpoConfig(_message.Message):
    __slots__ = ("group_size", "max_completion_tokens", "lora_rank", "lora_alpha", "learning_rate", "max_steps", "batch_size")
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    LORA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    group_size: int
    max_completion_tokens: int
    lora_rank: int
    lora_alpha: int
    learning_rate: float
    max_steps: int
    batch_size: int
    def __init__(self, group_size: _Optional[int] = ..., max_completion_tokens: _Optional[int] = ..., lora_rank: _Optional[int] = ..., lora_alpha: _Optional[int] = ..., learning_rate: _Optional[float] = ..., max_steps: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class AdvancedOptions(_message.Message):
    __slots__ = ("loss_type", "epochs", "quantization", "generation_backend", "gpu_memory_fraction", "gpu_selection", "kl_beta", "temperature", "seed", "checkpoint_every", "dynamic_sampling", "lora_init", "num_processes", "precision", "max_async_steps", "epsilon_high", "sharding", "num_nodes", "top_p", "top_k", "min_p", "repetition_penalty", "num_iterations", "mini_batches", "mask_truncated_completions", "eval_every", "eval_size", "gradient_checkpointing")
    LOSS_TYPE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GPU_SELECTION_FIELD_NUMBER: _ClassVar[int]
    KL_BETA_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LORA_INIT_FIELD_NUMBER: _ClassVar[int]
    NUM_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    MAX_ASYNC_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_HIGH_FIELD_NUMBER: _ClassVar[int]
    SHARDING_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    NUM_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    MINI_BATCHES_FIELD_NUMBER: _ClassVar[int]
    MASK_TRUNCATED_COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    EVAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    loss_type: LossType
    epochs: int
    quantization: Quantization
    generation_backend: GenerationBackend
    gpu_memory_fraction: float
    gpu_selection: str
    kl_beta: float
    temperature: float
    seed: int
    checkpoint_every: int
    dynamic_sampling: bool
    lora_init: str
    num_processes: int
    precision: str
    max_async_steps: int
    epsilon_high: float
    sharding: str
    num_nodes: int
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    num_iterations: int
    mini_batches: int
    mask_truncated_completions: bool
    eval_every: int
    eval_size: int
    gradient_checkpointing: str
    def __init__(self, loss_type: _Optional[_Union[LossType, str]] = ..., epochs: _Optional[int] = ..., quantization: _Optional[_Union[Quantization, str]] = ..., generation_backend: _Optional[_Union[GenerationBackend, str]] = ..., gpu_memory_fraction: _Optional[float] = ..., gpu_selection: _Optional[str] = ..., kl_beta: _Optional[float] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ..., checkpoint_every: _Optional[int] = ..., dynamic_sampling: _Optional[bool] = ..., lora_init: _Optional[str] = ..., num_processes: _Optional[int] = ..., precision: _Optional[str] = ..., max_async_steps: _Optional[int] = ..., epsilon_high: _Optional[float] = ..., sharding: _Optional[str] = ..., num_nodes: _Optional[int] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., num_iterations: _Optional[int] = ..., mini_batches: _Optional[int] = ..., mask_truncated_completions: _Optional[bool] = ..., eval_every: _Optional[int] = ..., eval_size: _Optional[int] = ..., gradient_checkpointing: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "base_model", "reward", "grpo", "advanced", "init_adapter", "tracking", "environment", "method", "sft", "head")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    ADVANCED_FIELD_NUMBER: _ClassVar[int]
    INIT_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TRACKING_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    SFT_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    name: str
    base_model: str
    reward: RewardConfig
    grpo: GrpoConfig
    advanced: AdvancedOptions
    init_adapter: AdapterRef
    tracking: _containers.RepeatedCompositeFieldContainer[TrackerConfig]
    environment: EnvironmentConfig
    method: TrainingMethod
    sft: SftConfig
    head: HeadConfig
    def __init__(self, name: _Optional[str] = ..., base_model: _Optional[str] = ..., reward: _Optional[_Union[RewardConfig, _Mapping]] = ..., grpo: _Optional[_Union[GrpoConfig, _Mapping]] = ..., advanced: _Optional[_Union[AdvancedOptions, _Mapping]] = ..., init_adapter: _Optional[_Union[AdapterRef, _Mapping]] = ..., tracking: _Optional[_Iterable[_Union[TrackerConfig, _Mapping]]] = ..., environment: _Optional[_Union[EnvironmentConfig, _Mapping]] = ..., method: _Optional[_Union[TrainingMethod, str]] = ..., sft: _Optional[_Union[SftConfig, _Mapping]] = ..., head: _Optional[_Union[HeadConfig, _Mapping]] = ...) -> None: ...

class HeadConfig(_message.Message):
    __slots__ = ("dataset", "dataset_split", "text_column", "label_column", "task", "learning_rate", "epochs", "max_steps", "batch_size", "max_seq_length", "lora_rank", "lora_alpha", "lora_dropout", "target_modules", "reward_label")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    TEXT_COLUMN_FIELD_NUMBER: _ClassVar[int]
    LABEL_COLUMN_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    LORA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    LORA_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    REWARD_LABEL_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    dataset_split: str
    text_column: str
    label_column: str
    task: HeadTask
    learning_rate: float
    epochs: int
    max_steps: int
    batch_size: int
    max_seq_length: int
    lora_rank: int
    lora_alpha: int
    lora_dropout: float
    target_modules: str
    reward_label: str
    def __init__(self, dataset: _Optional[str] = ..., dataset_split: _Optional[str] = ..., text_column: _Optional[str] = ..., label_column: _Optional[str] = ..., task: _Optional[_Union[HeadTask, str]] = ..., learning_rate: _Optional[float] = ..., epochs: _Optional[int] = ..., max_steps: _Optional[int] = ..., batch_size: _Optional[int] = ..., max_seq_length: _Optional[int] = ..., lora_rank: _Optional[int] = ..., lora_alpha: _Optional[int] = ..., lora_dropout: _Optional[float] = ..., target_modules: _Optional[str] = ..., reward_label: _Optional[str] = ...) -> None: ...

class SftConfig(_message.Message):
    __slots__ = ("dataset", "dataset_split", "learning_rate", "epochs", "max_steps", "batch_size", "max_seq_length", "lora_rank", "lora_alpha", "lora_dropout", "target_modules", "completion_only_loss", "packing")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    LORA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    LORA_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_ONLY_LOSS_FIELD_NUMBER: _ClassVar[int]
    PACKING_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    dataset_split: str
    learning_rate: float
    epochs: int
    max_steps: int
    batch_size: int
    max_seq_length: int
    lora_rank: int
    lora_alpha: int
    lora_dropout: float
    target_modules: str
    completion_only_loss: bool
    packing: bool
    def __init__(self, dataset: _Optional[str] = ..., dataset_split: _Optional[str] = ..., learning_rate: _Optional[float] = ..., epochs: _Optional[int] = ..., max_steps: _Optional[int] = ..., batch_size: _Optional[int] = ..., max_seq_length: _Optional[int] = ..., lora_rank: _Optional[int] = ..., lora_alpha: _Optional[int] = ..., lora_dropout: _Optional[float] = ..., target_modules: _Optional[str] = ..., completion_only_loss: _Optional[bool] = ..., packing: _Optional[bool] = ...) -> None: ...

class EnvironmentConfig(_message.Message):
    __slots__ = ("key", "settings", "max_turns", "max_episode_tokens", "version")
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    key: str
    settings: _containers.ScalarMap[str, str]
    max_turns: int
    max_episode_tokens: int
    version: str
    def __init__(self, key: _Optional[str] = ..., settings: _Optional[_Mapping[str, str]] = ..., max_turns: _Optional[int] = ..., max_episode_tokens: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class TrackerConfig(_message.Message):
    __slots__ = ("kind", "target", "project", "run_name", "online")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    ONLINE_FIELD_NUMBER: _ClassVar[int]
    kind: TrackerKind
    target: str
    project: str
    run_name: str
    online: bool
    def __init__(self, kind: _Optional[_Union[TrackerKind, str]] = ..., target: _Optional[str] = ..., project: _Optional[str] = ..., run_name: _Optional[str] = ..., online: _Optional[bool] = ...) -> None: ...

class TrackingLink(_message.Message):
    __slots__ = ("kind", "location", "steps_logged", "error", "finished")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    STEPS_LOGGED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    kind: TrackerKind
    location: str
    steps_logged: int
    error: str
    finished: bool
    def __init__(self, kind: _Optional[_Union[TrackerKind, str]] = ..., location: _Optional[str] = ..., steps_logged: _Optional[int] = ..., error: _Optional[str] = ..., finished: _Optional[bool] = ...) -> None: ...

class TrainingSummary(_message.Message):
    __slots__ = ("method", "model", "reward", "group_size", "max_completion", "gpu_selection", "lora_rank", "learn_rate", "max_steps", "backend", "batch_size", "lora_alpha", "loss_type", "quantization", "total_steps", "settings")
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METHOD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPLETION_FIELD_NUMBER: _ClassVar[int]
    GPU_SELECTION_FIELD_NUMBER: _ClassVar[int]
    LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    LEARN_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LORA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    LOSS_TYPE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    method: str
    model: str
    reward: str
    group_size: int
    max_completion: int
    gpu_selection: str
    lora_rank: int
    learn_rate: float
    max_steps: int
    backend: str
    batch_size: int
    lora_alpha: int
    loss_type: str
    quantization: str
    total_steps: int
    settings: _containers.ScalarMap[str, str]
    def __init__(self, method: _Optional[str] = ..., model: _Optional[str] = ..., reward: _Optional[str] = ..., group_size: _Optional[int] = ..., max_completion: _Optional[int] = ..., gpu_selection: _Optional[str] = ..., lora_rank: _Optional[int] = ..., learn_rate: _Optional[float] = ..., max_steps: _Optional[int] = ..., backend: _Optional[str] = ..., batch_size: _Optional[int] = ..., lora_alpha: _Optional[int] = ..., loss_type: _Optional[str] = ..., quantization: _Optional[str] = ..., total_steps: _Optional[int] = ..., settings: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AdapterRef(_message.Message):
    __slots__ = ("name", "version", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    path: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "status", "created_at", "started_at", "finished_at", "error", "adapter", "summary", "warnings", "current_step", "total_steps", "worker", "queue_reason", "tracking")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_REASON_FIELD_NUMBER: _ClassVar[int]
    TRACKING_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: JobSpec
    status: JobStatus
    created_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error: str
    adapter: AdapterRef
    summary: TrainingSummary
    warnings: _containers.RepeatedScalarFieldContainer[str]
    current_step: int
    total_steps: int
    worker: str
    queue_reason: str
    tracking: _containers.RepeatedCompositeFieldContainer[TrackingLink]
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., status: _Optional[_Union[JobStatus, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., adapter: _Optional[_Union[AdapterRef, _Mapping]] = ..., summary: _Optional[_Union[TrainingSummary, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ..., current_step: _Optional[int] = ..., total_steps: _Optional[int] = ..., worker: _Optional[str] = ..., queue_reason: _Optional[str] = ..., tracking: _Optional[_Iterable[_Union[TrackingLink, _Mapping]]] = ...) -> None: ...

class MetricEvent(_message.Message):
    __slots__ = ("job_id", "step", "total_steps", "reward_mean", "reward_std", "accuracy", "format", "loss", "kl", "entropy", "completion_length_mean", "completion_length_max", "clipped_ratio", "learning_rate", "adapter_version", "generate_seconds", "score_seconds", "train_seconds", "sync_seconds", "step_seconds", "time", "policy_lag", "reward_components", "reward_errors", "logprob_gap", "logprob_gap_max", "sampler_correction", "turns_mean", "turns_max", "tool_calls", "tool_errors", "tool_seconds", "observation_tokens_mean", "episode_tokens_mean", "truncated_episodes", "failed_episodes", "episode_splits", "clip_fraction", "groups_with_signal", "heldout_accuracy", "token_accuracy", "tokens_per_second", "heldout_loss", "heldout_f1", "class_f1")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ClassF1Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_LENGTH_MEAN_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_LENGTH_MAX_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_RATIO_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SYNC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_GAP_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_GAP_MAX_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_CORRECTION_FIELD_NUMBER: _ClassVar[int]
    TURNS_MEAN_FIELD_NUMBER: _ClassVar[int]
    TURNS_MAX_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    TOOL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_TOKENS_MEAN_FIELD_NUMBER: _ClassVar[int]
    EPISODE_TOKENS_MEAN_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    FAILED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EPISODE_SPLITS_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_WITH_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_LOSS_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_F1_FIELD_NUMBER: _ClassVar[int]
    CLASS_F1_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    total_steps: int
    reward_mean: float
    reward_std: float
    accuracy: float
    format: float
    loss: float
    kl: float
    entropy: float
    completion_length_mean: float
    completion_length_max: int
    clipped_ratio: float
    learning_rate: float
    adapter_version: int
    generate_seconds: float
    score_seconds: float
    train_seconds: float
    sync_seconds: float
    step_seconds: float
    time: _timestamp_pb2.Timestamp
    policy_lag: int
    reward_components: _containers.ScalarMap[str, float]
    reward_errors: int
    logprob_gap: float
    logprob_gap_max: float
    sampler_correction: str
    turns_mean: float
    turns_max: int
    tool_calls: int
    tool_errors: int
    tool_seconds: float
    observation_tokens_mean: float
    episode_tokens_mean: float
    truncated_episodes: int
    failed_episodes: int
    episode_splits: int
    clip_fraction: float
    groups_with_signal: int
    heldout_accuracy: float
    token_accuracy: float
    tokens_per_second: float
    heldout_loss: float
    heldout_f1: float
    class_f1: _containers.ScalarMap[str, float]
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., reward_mean: _Optional[float] = ..., reward_std: _Optional[float] = ..., accuracy: _Optional[float] = ..., format: _Optional[float] = ..., loss: _Optional[float] = ..., kl: _Optional[float] = ..., entropy: _Optional[float] = ..., completion_length_mean: _Optional[float] = ..., completion_length_max: _Optional[int] = ..., clipped_ratio: _Optional[float] = ..., learning_rate: _Optional[float] = ..., adapter_version: _Optional[int] = ..., generate_seconds: _Optional[float] = ..., score_seconds: _Optional[float] = ..., train_seconds: _Optional[float] = ..., sync_seconds: _Optional[float] = ..., step_seconds: _Optional[float] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., policy_lag: _Optional[int] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., reward_errors: _Optional[int] = ..., logprob_gap: _Optional[float] = ..., logprob_gap_max: _Optional[float] = ..., sampler_correction: _Optional[str] = ..., turns_mean: _Optional[float] = ..., turns_max: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., tool_seconds: _Optional[float] = ..., observation_tokens_mean: _Optional[float] = ..., episode_tokens_mean: _Optional[float] = ..., truncated_episodes: _Optional[int] = ..., failed_episodes: _Optional[int] = ..., episode_splits: _Optional[int] = ..., clip_fraction: _Optional[float] = ..., groups_with_signal: _Optional[int] = ..., heldout_accuracy: _Optional[float] = ..., token_accuracy: _Optional[float] = ..., tokens_per_second: _Optional[float] = ..., heldout_loss: _Optional[float] = ..., heldout_f1: _Optional[float] = ..., class_f1: _Optional[_Mapping[str, float]] = ...) -> None: ...

class CompletionSamples(_message.Message):
    __slots__ = ("job_id", "step", "samples")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    samples: _containers.RepeatedCompositeFieldContainer[CompletionSample]
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[CompletionSample, _Mapping]]] = ...) -> None: ...

class CompletionSample(_message.Message):
    __slots__ = ("prompt", "completion", "reward", "accuracy")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    completion: str
    reward: float
    accuracy: float
    def __init__(self, prompt: _Optional[str] = ..., completion: _Optional[str] = ..., reward: _Optional[float] = ..., accuracy: _Optional[float] = ...) -> None: ...

class JobStatusEvent(_message.Message):
    __slots__ = ("job_id", "status", "message", "time", "adapter", "current_step")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: JobStatus
    message: str
    time: _timestamp_pb2.Timestamp
    adapter: AdapterRef
    current_step: int
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[_Union[JobStatus, str]] = ..., message: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., adapter: _Optional[_Union[AdapterRef, _Mapping]] = ..., current_step: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("status", "metric")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    status: JobStatusEvent
    metric: MetricEvent
    def __init__(self, status: _Optional[_Union[JobStatusEvent, _Mapping]] = ..., metric: _Optional[_Union[MetricEvent, _Mapping]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "seed", "max_tokens", "top_k", "min_p", "repetition_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    seed: int
    max_tokens: int
    top_k: int
    min_p: float
    repetition_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ...) -> None: ...

class RewardComponents(_message.Message):
    __slots__ = ("reward", "accuracy", "format", "strict", "extracted_answer", "timed_out", "components", "error", "note")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    EXTRACTED_ANSWER_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    reward: float
    accuracy: float
    format: float
    strict: bool
    extracted_answer: str
    timed_out: bool
    components: _containers.ScalarMap[str, float]
    error: str
    note: str
    def __init__(self, reward: _Optional[float] = ..., accuracy: _Optional[float] = ..., format: _Optional[float] = ..., strict: _Optional[bool] = ..., extracted_answer: _Optional[str] = ..., timed_out: _Optional[bool] = ..., components: _Optional[_Mapping[str, float]] = ..., error: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("path", "offset", "data", "file_size", "last", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    data: bytes
    file_size: int
    last: bool
    sha256: str
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., file_size: _Optional[int] = ..., last: _Optional[bool] = ..., sha256: _Optional[str] = ...) -> None: ...

class AdapterSelector(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...
