from google.protobuf import struct_pb2 as _struct_pb2
from rlvr.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProblemSplit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBLEM_SPLIT_UNSPECIFIED: _ClassVar[ProblemSplit]
    PROBLEM_SPLIT_TRAIN: _ClassVar[ProblemSplit]
    PROBLEM_SPLIT_HELDOUT: _ClassVar[ProblemSplit]
PROBLEM_SPLIT_UNSPECIFIED: ProblemSplit
PROBLEM_SPLIT_TRAIN: ProblemSplit
PROBLEM_SPLIT_HELDOUT: ProblemSplit

class ScoreItem(_message.Message):
    __slots__ = ("completion", "ground_truth", "prompt", "messages", "columns")
    class ColumnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    completion: str
    ground_truth: str
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    columns: _containers.MessageMap[str, _struct_pb2.Value]
    def __init__(self, completion: _Optional[str] = ..., ground_truth: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., columns: _Optional[_Mapping[str, _struct_pb2.Value]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("function", "items", "format_bonus", "format_bonus_weight", "timeout_seconds", "key", "terms", "accuracy_key")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_BONUS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_BONUS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TERMS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_KEY_FIELD_NUMBER: _ClassVar[int]
    function: _common_pb2.RewardFunction
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    format_bonus: bool
    format_bonus_weight: float
    timeout_seconds: float
    key: str
    terms: _containers.RepeatedCompositeFieldContainer[_common_pb2.RewardTerm]
    accuracy_key: str
    def __init__(self, function: _Optional[_Union[_common_pb2.RewardFunction, str]] = ..., items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ..., format_bonus: _Optional[bool] = ..., format_bonus_weight: _Optional[float] = ..., timeout_seconds: _Optional[float] = ..., key: _Optional[str] = ..., terms: _Optional[_Iterable[_Union[_common_pb2.RewardTerm, _Mapping]]] = ..., accuracy_key: _Optional[str] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results", "seconds")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.RewardComponents]
    seconds: float
    def __init__(self, results: _Optional[_Iterable[_Union[_common_pb2.RewardComponents, _Mapping]]] = ..., seconds: _Optional[float] = ...) -> None: ...

class GetProblemsRequest(_message.Message):
    __slots__ = ("function", "split", "limit", "seed", "dataset", "dataset_split", "key")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    function: _common_pb2.RewardFunction
    split: ProblemSplit
    limit: int
    seed: int
    dataset: str
    dataset_split: str
    key: str
    def __init__(self, function: _Optional[_Union[_common_pb2.RewardFunction, str]] = ..., split: _Optional[_Union[ProblemSplit, str]] = ..., limit: _Optional[int] = ..., seed: _Optional[int] = ..., dataset: _Optional[str] = ..., dataset_split: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class Problem(_message.Message):
    __slots__ = ("id", "question", "ground_truth", "compact", "messages", "columns")
    class ColumnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    id: str
    question: str
    ground_truth: str
    compact: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    columns: _containers.MessageMap[str, _struct_pb2.Value]
    def __init__(self, id: _Optional[str] = ..., question: _Optional[str] = ..., ground_truth: _Optional[str] = ..., compact: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., columns: _Optional[_Mapping[str, _struct_pb2.Value]] = ...) -> None: ...

class GetProblemsResponse(_message.Message):
    __slots__ = ("problems", "warnings", "instruction")
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    problems: _containers.RepeatedCompositeFieldContainer[Problem]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    instruction: str
    def __init__(self, problems: _Optional[_Iterable[_Union[Problem, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ..., instruction: _Optional[str] = ...) -> None: ...

class ListRewardFunctionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RewardFunctionInfo(_message.Message):
    __slots__ = ("function", "display_name", "description", "needs_dataset", "key", "columns", "default_benchmark", "benchmark_display_name", "instruction", "source", "accepts_dataset", "splits", "heldout_size", "dataset_names")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NEEDS_DATASET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_DATASET_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATASET_NAMES_FIELD_NUMBER: _ClassVar[int]
    function: _common_pb2.RewardFunction
    display_name: str
    description: str
    needs_dataset: bool
    key: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    default_benchmark: str
    benchmark_display_name: str
    instruction: str
    source: str
    accepts_dataset: bool
    splits: _containers.RepeatedScalarFieldContainer[str]
    heldout_size: int
    dataset_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, function: _Optional[_Union[_common_pb2.RewardFunction, str]] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., needs_dataset: _Optional[bool] = ..., key: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., default_benchmark: _Optional[str] = ..., benchmark_display_name: _Optional[str] = ..., instruction: _Optional[str] = ..., source: _Optional[str] = ..., accepts_dataset: _Optional[bool] = ..., splits: _Optional[_Iterable[str]] = ..., heldout_size: _Optional[int] = ..., dataset_names: _Optional[_Iterable[str]] = ...) -> None: ...

class UnavailableReward(_message.Message):
    __slots__ = ("key", "error")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    key: str
    error: str
    def __init__(self, key: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ListRewardFunctionsResponse(_message.Message):
    __slots__ = ("functions", "unavailable")
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    functions: _containers.RepeatedCompositeFieldContainer[RewardFunctionInfo]
    unavailable: _containers.RepeatedCompositeFieldContainer[UnavailableReward]
    def __init__(self, functions: _Optional[_Iterable[_Union[RewardFunctionInfo, _Mapping]]] = ..., unavailable: _Optional[_Iterable[_Union[UnavailableReward, _Mapping]]] = ...) -> None: ...
