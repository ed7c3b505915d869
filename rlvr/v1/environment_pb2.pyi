from google.protobuf import struct_pb2 as _struct_pb2
from rlvr.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeEnvironmentRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class DescribeEnvironmentResponse(_message.Message):
    __slots__ = ("key", "display_name", "description", "version", "tools", "max_turns", "columns", "instruction", "tool_timeout_seconds")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    TOOL_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    display_name: str
    description: str
    version: str
    tools: _containers.RepeatedScalarFieldContainer[str]
    max_turns: int
    columns: _containers.RepeatedScalarFieldContainer[str]
    instruction: str
    tool_timeout_seconds: float
    def __init__(self, key: _Optional[str] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., version: _Optional[str] = ..., tools: _Optional[_Iterable[str]] = ..., max_turns: _Optional[int] = ..., columns: _Optional[_Iterable[str]] = ..., instruction: _Optional[str] = ..., tool_timeout_seconds: _Optional[float] = ...) -> None: ...

class ResetEpisodeRequest(_message.Message):
    __slots__ = ("key", "episode_id", "prompt", "ground_truth", "columns", "messages", "seed", "settings")
    class ColumnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    key: str
    episode_id: str
    prompt: str
    ground_truth: str
    columns: _containers.MessageMap[str, _struct_pb2.Value]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    seed: int
    settings: _containers.ScalarMap[str, str]
    def __init__(self, key: _Optional[str] = ..., episode_id: _Optional[str] = ..., prompt: _Optional[str] = ..., ground_truth: _Optional[str] = ..., columns: _Optional[_Mapping[str, _struct_pb2.Value]] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., seed: _Optional[int] = ..., settings: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResetEpisodeResponse(_message.Message):
    __slots__ = ("prompt_addition",)
    PROMPT_ADDITION_FIELD_NUMBER: _ClassVar[int]
    prompt_addition: str
    def __init__(self, prompt_addition: _Optional[str] = ...) -> None: ...

class CallToolRequest(_message.Message):
    __slots__ = ("episode_id", "name", "arguments_json")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    name: str
    arguments_json: str
    def __init__(self, episode_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class CallToolResponse(_message.Message):
    __slots__ = ("content", "error")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    content: str
    error: str
    def __init__(self, content: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class StepEpisodeRequest(_message.Message):
    __slots__ = ("episode_id", "text")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    text: str
    def __init__(self, episode_id: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class StepEpisodeResponse(_message.Message):
    __slots__ = ("text", "done", "reward")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    text: str
    done: bool
    reward: float
    def __init__(self, text: _Optional[str] = ..., done: _Optional[bool] = ..., reward: _Optional[float] = ...) -> None: ...

class FinishEpisodeRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class FinishEpisodeResponse(_message.Message):
    __slots__ = ("reward", "components", "state_json")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    reward: float
    components: _containers.ScalarMap[str, float]
    state_json: str
    def __init__(self, reward: _Optional[float] = ..., components: _Optional[_Mapping[str, float]] = ..., state_json: _Optional[str] = ...) -> None: ...

class CloseEpisodeRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class CloseEpisodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
