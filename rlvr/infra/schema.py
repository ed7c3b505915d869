"""The store's schema, declared once: every table the scheduler and the benchmark keep.

docs/design.md, Store: jobs, metric points, loops and rounds, evaluations and per-question results,
artifacts; SQLite by default, PostgreSQL by URL. These SQLModel classes are the only declaration:
a new database's tables are built from them, services read and write these rows, and a metric
event of the contract maps onto `MetricPointRow` by field name (`metric_point_from_event`), so a
metric added to `MetricEvent` is one new column here plus the migration that adds it to existing
databases (rlvr/infra/migrations/versions/, one revision per change to these classes; a test
fails while the two disagree: docs/migrations.md).

Conventions:
- Ids are short random hex strings (`new_id`); they double as NATS subject tokens.
- Statuses are the contract enum's name without its prefix ("QUEUED", "RUNNING", ...).
- JSON columns (`*_json`) hold the protobuf message as `MessageToJson` writes it, so a stored spec
  reads back into the exact message without a second schema for specs.
- Timestamps are timezone-aware UTC on the way in and on the way out, on both databases; a naive
  datetime is refused (it would be silently read as UTC on one database and local time on another).
"""

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Dialect, Text, text
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

ARTIFACT_KINDS = frozenset({"adapter", "merged", "export", "checkpoint"})
# A loop in one of these has ended: no round may be added to it (Store.add_round_with_job).
LOOP_FINAL_STATUSES = frozenset({"TARGET_REACHED", "ROUNDS_SPENT", "PLATEAUED", "FAILED", "STOPPED"})


def new_id() -> str:
    """12 hex digits (48 random bits): short enough to type, and a valid subject token."""
    return uuid.uuid4().hex[:12]


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every dialect.

    PostgreSQL keeps `timestamptz` natively; SQLite has no time zones and would hand back naive
    values, so they are stored as naive UTC and made aware again on load.
    """

    impl = DateTime
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(timezone=True)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} refused: pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _created() -> Any:
    return Field(default_factory=utcnow, sa_type=UTCDateTime, index=True)


def _when() -> Any:
    return Field(default=None, sa_type=UTCDateTime)


class JobRow(SQLModel, table=True):
    """One RLVR training job (the contract's `Job`)."""

    __tablename__ = "jobs"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    name: str = ""
    spec_json: str = Field(default="{}", sa_type=Text)  # the resolved JobSpec
    status: str = Field(default="QUEUED", index=True)
    created_at: datetime = _created()
    started_at: datetime | None = _when()
    finished_at: datetime | None = _when()
    error: str = ""  # when FAILED: the cause in one line
    adapter_name: str = ""
    adapter_version: int = Field(default=0, sa_type=BigInteger)
    adapter_path: str = ""
    warnings_json: str = Field(default="[]", sa_type=Text)
    worker: str = ""  # the trainer worker that runs it
    current_step: int = 0
    total_steps: int = 0
    # While QUEUED: why no worker has it yet (Job.queue_reason).
    queue_reason: str = Field(default="", sa_type=Text, sa_column_kwargs={"server_default": text("''")})
    # How many times the job was queued again after its trainer was lost (at most MAX_RESUMES,
    # services/scheduler/dispatch.py): kept here so a restarted scheduler does not start the count again.
    resumes: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class MetricPointRow(SQLModel, table=True):
    """One optimizer step of one job: the contract's `MetricEvent`, field for field.

    (job_id, step) is the primary key: the database itself refuses a second copy of a step, which
    is what makes storage exactly-once even when two consumers race on a redelivered event.
    """

    __tablename__ = "metric_points"

    job_id: str = Field(primary_key=True, foreign_key="jobs.id", ondelete="CASCADE", max_length=64)
    step: int = Field(primary_key=True)
    total_steps: int = 0
    reward_mean: float = 0.0
    reward_std: float = 0.0
    accuracy: float = 0.0
    format: float = 0.0
    loss: float = 0.0
    kl: float | None = None  # only when kl_beta > 0
    entropy: float | None = None
    completion_length_mean: float = 0.0
    completion_length_max: int = 0
    clipped_ratio: float = 0.0
    learning_rate: float = 0.0
    adapter_version: int = Field(default=0, sa_type=BigInteger)
    generate_seconds: float = 0.0
    score_seconds: float = 0.0
    train_seconds: float = 0.0
    sync_seconds: float = 0.0
    step_seconds: float = 0.0
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)  # the event's time
    policy_lag: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # MetricEvent.reward_components as a JSON object {"<key>": mean, ...}.
    reward_components: str = Field(default="{}", sa_type=Text, sa_column_kwargs={"server_default": text("'{}'")})
    reward_errors: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # The sampler/trainer logprob gap (None: the generator reported no logprobs) and the reasons the
    # step was importance-corrected ("" = none).
    logprob_gap: float | None = None
    logprob_gap_max: float | None = None
    sampler_correction: str = Field(default="", sa_type=Text, sa_column_kwargs={"server_default": text("''")})
    # The episode metrics of a job with an environment (None at a single-answer job's steps).
    turns_mean: float | None = None
    turns_max: int | None = None
    tool_calls: int | None = None
    tool_errors: int | None = None
    tool_seconds: float | None = None
    observation_tokens_mean: float | None = None
    episode_tokens_mean: float | None = None
    truncated_episodes: int | None = None
    failed_episodes: int | None = None
    episode_splits: int | None = None
    # The share of completion tokens whose importance ratio the loss clipped (None: a loss that does
    # not clip, or a point stored before it).
    clip_fraction: float | None = None
    # The step's groups whose rewards differ (None: a point stored before the count).
    groups_with_signal: int | None = None
    # Evaluation while training: the step adapter's held-out accuracy (None at the other steps).
    heldout_accuracy: float | None = None
    # A Supervised (SFT) job's steps: token accuracy and tokens per second; its held-out loss at the
    # steps it evaluated (None at an RLVR job's steps).
    token_accuracy: float | None = None
    tokens_per_second: float | None = None
    heldout_loss: float | None = None
    # A Head job's evaluations (classification): the held-out macro F1 (None elsewhere) and each
    # class's F1 as a JSON object {"<class>": f1, ...} (MetricEvent.class_f1).
    heldout_f1: float | None = None
    class_f1: str = Field(default="{}", sa_type=Text, sa_column_kwargs={"server_default": text("'{}'")})

    def components(self) -> dict[str, float]:
        """reward_components as a mapping."""
        return {str(k): float(v) for k, v in json.loads(self.reward_components or "{}").items()}

    def class_scores(self) -> dict[str, float]:
        """class_f1 as a mapping."""
        return {str(k): float(v) for k, v in json.loads(self.class_f1 or "{}").items()}


class LoopRow(SQLModel, table=True):
    """An automated training loop: train a round, benchmark it, retrain the winner.

    The table is `training_loops` (not `loops`): the first release had an unused `loops` table of
    another shape (migration 0002 drops it when empty). Best score, best round and the elapsed and
    phase times are derived from the rounds when read, never stored twice.
    """

    __tablename__ = "training_loops"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    name: str = ""
    spec_json: str = Field(default="{}", sa_type=Text)  # the resolved LoopSpec
    status: str = Field(default="QUEUED", index=True)  # LoopStatus name without its prefix
    created_at: datetime = _created()
    started_at: datetime | None = _when()
    finished_at: datetime | None = _when()
    error: str = ""  # when FAILED: the cause in one line
    message: str = ""  # what the loop is doing, or why it stopped
    warnings_json: str = Field(default="[]", sa_type=Text)
    # The base model's score on the loop's benchmark, measured once before round 1.
    baseline_evaluation_id: str = ""
    baseline_score: float | None = None  # percent
    baseline_questions: int = 0
    baseline_seconds: float = 0.0
    evaluation_attempts: int = 0  # re-runs of an interrupted evaluation (baseline or round), bounded


class RoundRow(SQLModel, table=True):
    """One round of a loop: its training job and the evaluation that scored it.

    A round and its job are inserted in one transaction (`Store.add_round_with_job`), so a
    scheduler that dies while starting a round leaves both or neither. `evaluation_id` has no
    foreign key: evaluations belong to the benchmark service, whose database may be another one.
    """

    __tablename__ = "loop_rounds"

    loop_id: str = Field(primary_key=True, foreign_key="training_loops.id", ondelete="CASCADE", max_length=64)
    index: int = Field(primary_key=True)  # 1-based, as the loop page numbers rounds R1, R2, ...
    job_id: str | None = Field(default=None, foreign_key="jobs.id", ondelete="SET NULL", max_length=64)
    evaluation_id: str = ""
    status: str = "TRAINING"  # RoundStatus name without its prefix
    base_round: int = 0  # the round whose adapter it trained on top of (0 = the base model)
    score: float | None = None  # percent, once scored
    questions: int = 0  # benchmark questions behind the score
    gain_threshold: float = 0.0  # points a gain had to exceed to be real
    real_gain: bool = False
    started_at: datetime | None = _when()
    finished_at: datetime | None = _when()
    training_seconds: float = 0.0
    benchmarking_seconds: float = 0.0
    reclaimed_bytes: int = Field(default=0, sa_type=BigInteger)
    error: str = ""
    # LoopSpec.best_step: the step whose checkpoint is the round's adapter, and that folder (0, "": the
    # job's final adapter).
    adapter_step: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    adapter_path: str = Field(default="", sa_type=Text, sa_column_kwargs={"server_default": text("''")})


class EvaluationRow(SQLModel, table=True):
    """A benchmark run of a model or adapter, with its score breakdown."""

    __tablename__ = "evaluations"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    model: str = ""
    adapter_name: str = ""
    adapter_version: int = Field(default=0, sa_type=BigInteger)
    benchmark: str = ""
    limit: int | None = None  # questions to run; None = the whole benchmark
    seed: int | None = Field(default=None, sa_type=BigInteger)
    sampling_json: str = Field(default="{}", sa_type=Text)
    status: str = Field(default="QUEUED", index=True)
    created_at: datetime = _created()
    started_at: datetime | None = _when()
    finished_at: datetime | None = _when()
    error: str = ""
    score: float | None = None  # the value of `score_column`
    accuracy: float | None = None
    accuracy_strict: float | None = None
    format: float | None = None
    answered: int = 0
    n_questions: int = 0
    n_done: int = 0
    score_column: str = "accuracy"


class QuestionResultRow(SQLModel, table=True):
    """One question of an evaluation (the Detailed Results table)."""

    __tablename__ = "question_results"

    evaluation_id: str = Field(
        primary_key=True, foreign_key="evaluations.id", ondelete="CASCADE", max_length=64
    )
    index: int = Field(primary_key=True)
    prompt: str = Field(default="", sa_type=Text)
    ground_truth: str = Field(default="", sa_type=Text)
    completion: str = Field(default="", sa_type=Text)
    extracted_answer: str = Field(default="", sa_type=Text)
    reward: float = 0.0
    accuracy: float = 0.0
    format: float = 0.0
    strict: bool = False
    finish_reason: str = ""  # "STOP" or "LENGTH"
    # An evaluation with an environment: the question's episode turn by turn, as JSON
    # (rlvr.episodes.scoring.episode_record; `completion` holds its transcript). "" for single answers.
    episode: str = Field(default="", sa_type=Text, sa_column_kwargs={"server_default": text("''")})


class ArtifactRow(SQLModel, table=True):
    """A file tree a job produced: adapter, merged model, export or checkpoint."""

    __tablename__ = "artifacts"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    job_id: str = Field(foreign_key="jobs.id", ondelete="CASCADE", index=True, max_length=64)
    kind: str = "adapter"  # one of ARTIFACT_KINDS
    path: str = Field(default="", sa_type=Text)  # under the artifact root
    size_bytes: int = Field(default=0, sa_type=BigInteger)
    created_at: datetime = _created()


class StoreMetaRow(SQLModel, table=True):
    """Facts about the database itself, one row each (`Store.store_id`: which database this is,
    whatever URL reaches it)."""

    __tablename__ = "store_meta"

    key: str = Field(primary_key=True, max_length=64)
    value: str = Field(default="", sa_type=Text)


# Creation order follows the foreign keys; a new database gets exactly these (rlvr.infra.migrate).
TABLES: tuple[type[SQLModel], ...] = (
    StoreMetaRow,
    JobRow,
    MetricPointRow,
    LoopRow,
    EvaluationRow,
    RoundRow,
    QuestionResultRow,
    ArtifactRow,
)


def metric_point_from_event(event: Any) -> MetricPointRow:
    """Map a contract `MetricEvent` onto a row by field name; an unset optional field (kl,
    entropy) stays None rather than reading as 0. The event is typed Any so this module does not
    import generated code; the event's `time` becomes `created_at`."""
    fields = event.DESCRIPTOR.fields_by_name
    values: dict[str, Any] = {}
    for name in MetricPointRow.model_fields:
        if name == "created_at":
            continue
        if fields[name].message_type is not None and fields[name].message_type.GetOptions().map_entry:
            values[name] = json.dumps(dict(sorted(getattr(event, name).items())))  # a map field, as JSON
        elif fields[name].has_presence and not event.HasField(name):
            values[name] = None
        else:
            values[name] = getattr(event, name)
    if event.HasField("time"):
        values["created_at"] = event.time.ToDatetime(tzinfo=UTC)
    return MetricPointRow(**values)
