"""Settings of the trainer service (a GRPO worker)."""

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import (
    DEFAULT_PORTS,
    ArtifactFields,
    DataRootFields,
    NatsFields,
    PeerFields,
    ServiceSettings,
    port_field,
)
from rlvr.infra.events import MAX_OUTAGE_S


class TrainerSettings(PeerFields, NatsFields, ArtifactFields, DataRootFields, ServiceSettings):
    service_name = "trainer"
    model_config = SettingsConfigDict(env_prefix="RLVR_TRAINER_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(DEFAULT_PORTS["trainer"])
    """gRPC port of this trainer worker."""
    worker_name: str = "trainer-0"
    """Name this worker reports to the scheduler and stamps on its jobs."""
    scorer: Literal["reward_service", "local"] = "reward_service"
    """How completions are scored: through the reward service (reward_address), or in the job
    process with the same scoring functions (no reward service needed)."""
    cancel_grace_seconds: float = Field(default=5.0, ge=0.0, le=600.0)
    """On CancelJob: how long the job process may take to finish its step and save before SIGKILL
    (the last finished step's adapter is on disk either way)."""
    rollout_wait_seconds: float = Field(default=300.0, ge=0.0, le=86_400.0)
    """A job whose rollout server goes away (killed, restarting: vLLM takes tens of seconds to
    start) waits this long for it, then fails naming the rollout service; while it waits, the
    job's status message says so."""
    reward_wait_seconds: float = Field(default=300.0, ge=0.0, le=86_400.0)
    """A job whose reward service (or a remote reward it forwards to) goes away waits this long for
    it, then fails naming it; while it waits, the job's status message says so."""
    nats_outage_seconds: float = Field(default=300.0, ge=1.0, le=MAX_OUTAGE_S)
    """A job rides out a NATS outage (a restart, a network cut) this long: its events wait and are
    published, each once, when NATS is back. NATS taking none of them for longer (or unreachable
    this long when the job starts) fails the job with a message naming NATS and this setting. At
    most 600 s: the stream's duplicate window (900 s) must outlast it."""
    disk_wait_seconds: float = Field(default=300.0, ge=0.0, le=86_400.0)
    """A job whose artifact root fills up (a checkpoint, the step's adapter or progress.json finds
    no space) waits this long for space, the write taken again whenever the free space grows, then
    fails with a message naming the disk and its free bytes; while it waits, the job's status
    message says so. No half-written checkpoint is left, and the step goes on exactly as it would
    have. A job of several processes waits only for its adapter and progress (keep the wait under
    the process group's timeout, NCCL's 10 min); its TRL checkpoint, which all of its processes
    write together, fails at once."""
    torch_threads: int = Field(default=0, ge=0, le=1024)
    """Torch CPU threads of a job process (0 = every core it may run on). Small models step faster
    on 1: measured on 2 shared cores, 8 x 32 tokens from the "test" tiny model took 0.08 s on one
    thread and 0.3-1.3 s on two."""
    model_roots: list[Path] = Field(default_factory=list)
    """Folders whose model subfolders (each with a config.json) this worker reports as cached base
    models, besides $RLVR_HOME/models (JSON list or comma list): the scheduler gives a job whose
    base model is a folder under one of them only to a worker that has it."""
    colocate_enforce_eager: bool | None = None
    """vLLM (colocate) jobs: run the job's vLLM engine eagerly (True) or compile its graph (False);
    unset = eager on a CPU-only host, compiled with CUDA, as the rollout server decides. Measured
    here (2 shared cores, rlvr-tiny): compiled, the engine started in 18-47 s instead of 3-4 s and
    generated up to ~2x faster."""
    job_start: Literal["auto", "fork", "fresh"] = "auto"
    """How a job process starts: "fork" = forked from a process of this service's that imported
    torch, transformers, peft and TRL when the service started (forkserver.py: a job skips about 8 s
    of CPU of imports; that process holds about 0.9 GB); "fresh" = a new interpreter that imports
    them itself; "auto" = fork on a host without a GPU driver, fresh with one (CUDA state must not
    cross a fork). A job of several processes started so starts its ranks so: forked from its
    job process, which runs torchrun's agent, or each a fresh interpreter torchrun starts."""
    rendezvous_address: str = ""
    """A job of several nodes (advanced.num_nodes): the address the other trainer hosts reach this
    one at, for torchrun's rendezvous and the process group (torchrun --local-addr); "" = this
    host's fully qualified name, which the other hosts must then resolve to it."""
