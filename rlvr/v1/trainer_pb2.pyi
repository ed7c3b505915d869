from rlvr.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartJobRequest(_message.Message):
    __slots__ = ("job_id", "spec", "total_steps", "resume", "stored_steps", "init_adapter_source", "resume_source", "node_rank", "rendezvous_endpoint")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    STORED_STEPS_FIELD_NUMBER: _ClassVar[int]
    INIT_ADAPTER_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RESUME_SOURCE_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: _common_pb2.JobSpec
    total_steps: int
    resume: bool
    stored_steps: int
    init_adapter_source: str
    resume_source: str
    node_rank: int
    rendezvous_endpoint: str
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., total_steps: _Optional[int] = ..., resume: _Optional[bool] = ..., stored_steps: _Optional[int] = ..., init_adapter_source: _Optional[str] = ..., resume_source: _Optional[str] = ..., node_rank: _Optional[int] = ..., rendezvous_endpoint: _Optional[str] = ...) -> None: ...

class StartJobResponse(_message.Message):
    __slots__ = ("job_id", "worker")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker: str
    def __init__(self, job_id: _Optional[str] = ..., worker: _Optional[str] = ...) -> None: ...

class TrainerCancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class TrainerCancelJobResponse(_message.Message):
    __slots__ = ("job_id", "adapter")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    adapter: _common_pb2.AdapterRef
    def __init__(self, job_id: _Optional[str] = ..., adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ...) -> None: ...

class GetWorkerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker", "busy", "job_id", "current_step", "total_steps", "last_job_id", "last_job_status", "last_job_error", "last_job_adapter", "last_job_lost", "capabilities")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_LOST_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    worker: str
    busy: bool
    job_id: str
    current_step: int
    total_steps: int
    last_job_id: str
    last_job_status: _common_pb2.JobStatus
    last_job_error: str
    last_job_adapter: _common_pb2.AdapterRef
    last_job_lost: bool
    capabilities: WorkerCapabilities
    def __init__(self, worker: _Optional[str] = ..., busy: _Optional[bool] = ..., job_id: _Optional[str] = ..., current_step: _Optional[int] = ..., total_steps: _Optional[int] = ..., last_job_id: _Optional[str] = ..., last_job_status: _Optional[_Union[_common_pb2.JobStatus, str]] = ..., last_job_error: _Optional[str] = ..., last_job_adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ..., last_job_lost: _Optional[bool] = ..., capabilities: _Optional[_Union[WorkerCapabilities, _Mapping]] = ...) -> None: ...

class GpuDevice(_message.Message):
    __slots__ = ("index", "name", "memory_bytes", "bf16")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BF16_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    memory_bytes: int
    bf16: bool
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., bf16: _Optional[bool] = ...) -> None: ...

class WorkerCapabilities(_message.Message):
    __slots__ = ("device_kind", "gpus", "cpu_cores", "memory_bytes", "precisions", "quantizations", "vllm_colocate", "max_num_processes", "cached_models", "model_roots", "hub_offline")
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRECISIONS_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATIONS_FIELD_NUMBER: _ClassVar[int]
    VLLM_COLOCATE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    CACHED_MODELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ROOTS_FIELD_NUMBER: _ClassVar[int]
    HUB_OFFLINE_FIELD_NUMBER: _ClassVar[int]
    device_kind: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuDevice]
    cpu_cores: int
    memory_bytes: int
    precisions: _containers.RepeatedScalarFieldContainer[str]
    quantizations: _containers.RepeatedScalarFieldContainer[str]
    vllm_colocate: bool
    max_num_processes: int
    cached_models: _containers.RepeatedScalarFieldContainer[str]
    model_roots: _containers.RepeatedScalarFieldContainer[str]
    hub_offline: bool
    def __init__(self, device_kind: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuDevice, _Mapping]]] = ..., cpu_cores: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., precisions: _Optional[_Iterable[str]] = ..., quantizations: _Optional[_Iterable[str]] = ..., vllm_colocate: _Optional[bool] = ..., max_num_processes: _Optional[int] = ..., cached_models: _Optional[_Iterable[str]] = ..., model_roots: _Optional[_Iterable[str]] = ..., hub_offline: _Optional[bool] = ...) -> None: ...

class MergeAdapterRequest(_message.Message):
    __slots__ = ("base_model", "adapter_path", "output_name", "dtype")
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_PATH_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    base_model: str
    adapter_path: str
    output_name: str
    dtype: str
    def __init__(self, base_model: _Optional[str] = ..., adapter_path: _Optional[str] = ..., output_name: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...

class MergeProgress(_message.Message):
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

class FetchFolderRequest(_message.Message):
    __slots__ = ("path", "files", "have", "resume_path", "resume_offset")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    HAVE_FIELD_NUMBER: _ClassVar[int]
    RESUME_PATH_FIELD_NUMBER: _ClassVar[int]
    RESUME_OFFSET_FIELD_NUMBER: _ClassVar[int]
    path: str
    files: _containers.RepeatedScalarFieldContainer[str]
    have: _containers.RepeatedCompositeFieldContainer[FileDigest]
    resume_path: str
    resume_offset: int
    def __init__(self, path: _Optional[str] = ..., files: _Optional[_Iterable[str]] = ..., have: _Optional[_Iterable[_Union[FileDigest, _Mapping]]] = ..., resume_path: _Optional[str] = ..., resume_offset: _Optional[int] = ...) -> None: ...

class FileDigest(_message.Message):
    __slots__ = ("path", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256: str
    def __init__(self, path: _Optional[str] = ..., sha256: _Optional[str] = ...) -> None: ...
