"""The New Training form and the "Start an automated loop" form: their fields, field for field as the
spec lists them, the values a submitted form turns into (a JobSpec, a LoopSpec), and where the
server's INVALID_ARGUMENT error goes back on the page.

Field names are the contract's field paths (`grpo.lora_rank`; `loop.target` for the LoopSpec's own
fields), so the field named at the start of an error message (`grpo.lora_rank: 99 is out of
range; ...`, or `job.grpo.lora_rank: ...` from CreateLoop) is the input the error belongs next
to. The job fields are the rows of rlvr/jobspec/fields.py's table (label, help, where they apply); only
the widget is the console's own. Nothing here knows a range (clients/web/limits.py takes them from
the same table), and a field left empty stays unset in the spec, so the scheduler fills in its default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rlvr.clients.web.limits import FormLimits, get_path, set_path
from rlvr.jobspec import FIELDS_BY_PATH, SPEC_FIELDS, SpecField
from rlvr.peers.base import RlvrError
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S


@dataclass(frozen=True)
class Field:
    path: str        # the form name: a JobSpec path, or "loop.<LoopSpec field>"
    label: str       # the spec's label
    kind: str        # int | float | text | bool | enum | word (a closed list of strings) | map (KEY=VALUE pairs)
    widget: str      # slider | number | lr | steps | batch | radio | select | checkbox | text | percent
    help: str = ""   # the spec's words for it
    only: str = ""   # shown and sent only with: generated | dataset | colocate | vllm | environment | sft |
    #                  dataset_benchmark
    step: str = "1"  # the input's step ("any" for floats)

    @property
    def id(self) -> str:
        return "f-" + self.path.replace(".", "-")


# The console's widget of a field where it is not the kind's default (number, checkbox, select, text).
WIDGETS = {"reward.key": "radio", "grpo.group_size": "slider", "grpo.max_completion_tokens": "slider",
           "grpo.lora_rank": "slider", "grpo.lora_alpha": "slider", "grpo.learning_rate": "lr",
           "grpo.max_steps": "steps", "grpo.batch_size": "batch", "sft.max_steps": "steps", "sft.learning_rate": "lr",
           "head.max_steps": "steps", "head.learning_rate": "lr",
           "advanced.gpu_memory_fraction": "slider",
           "advanced.gpu_selection": "text"}
STEPS = {"advanced.gpu_memory_fraction": "0.05"}
_KIND_WIDGETS = {"int": "number", "float": "number", "bool": "checkbox", "enum": "select", "word": "select",
                 "text": "text", "map": "text"}
_NO_HINT = {"reward.key"}  # each reward choice carries its own note


def _field(row: SpecField) -> Field:
    """A job field of the form, from its row in rlvr/jobspec/fields.py's table."""
    return Field(row.path, row.label, row.kind, WIDGETS.get(row.path, _KIND_WIDGETS[row.kind]),
                 "" if row.path in _NO_HINT else row.help, only=row.applies,
                 step=STEPS.get(row.path, "any" if row.kind == "float" else "1"))


RUN, REWARD, GRPO, SFT, HEAD, ADVANCED = ([_field(r) for r in SPEC_FIELDS if r.card == card and r.path != "method"]
                                          for card in ("run", "reward", "grpo", "sft", "head", "advanced"))
# The Training Method selector: its own radio group in the Run card (train.html), values the enum's.
METHOD = _field(FIELDS_BY_PATH["method"])
# (value, label, note, the card it shows: its `data-card`, which console.js reads; "rlvr" = Reward and GRPO)
METHOD_CHOICES = ((C.TRAINING_METHOD_SFT, "Supervised (SFT)", "A LoRA adapter learns a labeled dataset's completions "
                   "(prompt and completion columns, or chat messages): TRL's SFTTrainer.", "sft"),
                  (C.TRAINING_METHOD_RLVR, "Reinforcement (RLVR)", "GRPO on a LoRA adapter: the model generates its "
                   "own answers and a reward function scores them.", "rlvr"),
                  (C.TRAINING_METHOD_HEAD, "Head", "A classification or regression head on the base model learns a "
                   "dataset's text -> label; it can then score completions as a reward (head_<job id>).", "head"))
METHOD_CARDS = {str(value): card for value, _, _, card in METHOD_CHOICES}
RLVR_ONLY = {f.path for f in REWARD + GRPO}  # the cards an SFT or Head job does not read (hidden, not sent)
LOOP = [
    Field("loop.name", "Name", "text", "text", "Labels the loop, for example “math-pairs to 35%”."),
    Field("loop.benchmark", "Benchmark", "word", "select", "Which environment scores each round."),
    Field("loop.score_column", "Score Column", "word", "select",
          "The leaderboard column read back each round; resets when you change the benchmark."),
    Field("loop.target", "Target", "float", "percent",
          "Stop once the score reaches this percent, on the leaderboard's scale.", step="any"),
    Field("loop.max_rounds", "Max Rounds", "int", "number", "Upper bound on rounds; each one is a full training run."),
    Field("loop.give_up_after", "Give Up After", "int", "number",
          "Stop early if this many rounds in a row show no real gain."),
    Field("loop.reclaim_storage", "Reclaim storage between rounds", "bool", "checkbox",
          "Rounds only ever publish their LoRA adapter, which is always kept; uncheck it if a round's merged "
          "export should also survive."),
    Field("loop.best_step", "Best step of each round", "bool", "checkbox",
          "Score and stack on each round's best evaluated step (held-out accuracy) instead of its last; needs "
          "Evaluate every and Checkpoint every."),
    Field("loop.benchmark_limit", "Questions per evaluation", "int", "number", "0 = the whole benchmark."),
    Field("loop.min_gain", "Real-gain threshold", "float", "number",
          "Points a round must gain over the best before it; empty = one standard error.", step="any"),
    Field("loop.benchmark_dataset", "Benchmark dataset", "text", "text",
          "Boxed benchmark only: the dataset to score on (default: the job's dataset).", only="dataset_benchmark"),
]
JOB_FIELDS = RUN + [METHOD] + REWARD + GRPO + SFT + HEAD + ADVANCED
ALL_FIELDS = {f.path: f for f in JOB_FIELDS + LOOP}



def reward_note(reward: object) -> tuple[str, str]:
    """A reward choice's note: its description, and the spec's "Needs a dataset?" answer."""
    needs = ("Yes, pick one in the Dataset field" if getattr(reward, "needs_dataset", False) else
             "No, or pick one in the Dataset field" if getattr(reward, "accepts_dataset", False) else
             "No, uses its built-in dataset" if getattr(reward, "splits", None) else "No, self-generated")
    columns = list(getattr(reward, "columns", []))
    reads = f" It reads the dataset's {', '.join(columns)} column{'s' if len(columns) > 1 else ''}." if columns else ""
    return f"{getattr(reward, 'description', '')}{reads}", needs


def model_label(model: object) -> str:
    """A Base model suggestion's label: "bundled" or what it is ("134.5M, LlamaForCausalLM, imported: smollm2-135m")."""
    parameters = getattr(model, "parameters", 0)
    if not parameters:
        return str(getattr(model, "source", ""))
    return f"{parameters / 1e6:.1f}M, {getattr(model, 'architecture', '')}, {getattr(model, 'source', '')}"


def generates(reward: object) -> bool:
    """The reward makes its own prompts (Math Pairs; the code reward without a dataset): the
    Synthetic prompts field applies."""
    return not (getattr(reward, "needs_dataset", False) or getattr(reward, "splits", None))


_FIELD_PATH = re.compile(r"^([a-z_]+(?:\.[a-z_]+)*): ")


class FormErrors(dict[str, str]):
    """Errors by field path; "" holds an error that belongs to no field (shown above the form)."""


def parse_pairs(text: str) -> dict[str, str]:
    """A map field's text, "KEY=VALUE" pairs separated by commas or new lines (`difficulty=hard,
    seed=3`), as a dict; ValueError naming the first pair without "=" (the server checks the keys)."""
    out: dict[str, str] = {}
    for part in re.split(r"[,\n]", text):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(part.strip())
        out[key.strip()] = value.strip()
    return out


def pairs_text(pairs: Mapping[str, str]) -> str:
    """A map field's value as the form shows it: parse_pairs' input."""
    return ", ".join(f"{k}={v}" for k, v in sorted(pairs.items()))


def _number(text: str, kind: str) -> int | float:
    value: int | float = int(text) if kind == "int" else float(text.removesuffix("%"))
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(text)
    return value


def _parse(fields: list[Field], form: Mapping[str, str], message: object, errors: FormErrors,
           active: set[str], strip: str = "") -> None:
    """Sets every field of `fields` found in `form` on `message` (paths without `strip`)."""
    for f in fields:
        if f.only and f.only not in active:
            continue
        path = f.path.removeprefix(strip)
        raw = form.get(f.path, "")
        text = raw.strip() if isinstance(raw, str) else ""
        if f.kind == "bool":
            set_path(message, path, bool(text))  # an unchecked box sends nothing: off
            continue
        if not text:
            continue  # unset: the server's default
        if f.kind == "map":
            try:
                get_path(message, path).update(parse_pairs(text))
            except ValueError as e:
                errors[f.path] = f"{str(e)!r} is not KEY=VALUE"
            continue
        try:
            value: object = (_number(text, f.kind) if f.kind in ("int", "float") else
                             int(text) if f.kind == "enum" else text)
        except ValueError:
            what = "a whole number" if f.kind in ("int", "enum") else "a number"
            errors[f.path] = f"{text!r} is not {what}"
            continue
        try:
            set_path(message, path, value)
        except (ValueError, TypeError):  # e.g. a negative seed (uint64)
            errors[f.path] = f"{text!r} is out of range for {f.label}"


def active_options(form: Mapping[str, str], limits: FormLimits | None = None) -> set[str]:
    """Which conditional fields the form's choices show: the reward's, the backend's, the environment's,
    the benchmark's."""
    card = METHOD_CARDS.get(str(form.get("method", "")).strip(), "rlvr")
    if card != "rlvr":
        return {card}  # SFT's or Head's own card: none of RLVR's conditional fields applies
    active = {"rlvr"}
    key = str(form.get("reward.key", "")).strip()
    reward = limits.reward(key) if limits is not None else None
    if reward is not None and generates(reward) or reward is None and key in ("", "math_pairs"):
        active.add("generated")
    if reward is not None and (reward.needs_dataset or reward.accepts_dataset):
        active.add("dataset")
    backend = str(form.get("advanced.generation_backend", "")).strip()
    if backend == str(C.GENERATION_BACKEND_VLLM_COLOCATE):
        active.add("colocate")
    if backend in ("", str(C.GENERATION_BACKEND_VLLM)):
        active.add("vllm")
    if str(form.get("environment.key", "")).strip():
        active.add("environment")
    benchmark = str(form.get("loop.benchmark", "")).strip()
    if limits is not None and any(b.name == benchmark and b.needs_dataset for b in limits.benchmarks):
        active.add("dataset_benchmark")
    return active


def job_spec(form: Mapping[str, str], limits: FormLimits | None = None) -> tuple[C.JobSpec, FormErrors]:
    """The JobSpec of a submitted New Training form, and the values that are not numbers at all."""
    spec, errors = C.JobSpec(), FormErrors()
    active = active_options(form, limits)
    fields = [f for f in JOB_FIELDS if "rlvr" in active or f.path not in RLVR_ONLY]
    _parse(fields, form, spec, errors, active)
    return spec, errors


def loop_spec(form: Mapping[str, str], limits: FormLimits | None = None) -> tuple[S.LoopSpec, FormErrors]:
    """The LoopSpec of the form's "Start an automated loop" part plus its job settings. The job's own
    name stays empty: the scheduler names each round's job "<loop name> R<k>"."""
    job, errors = job_spec(form, limits)
    job.name = ""
    spec = S.LoopSpec(job=job)
    _parse(LOOP, form, spec, errors, active_options(form, limits), strip="loop.")
    return spec, errors


def error_field(details: str, *, loop: bool = False) -> str:
    """The form field an INVALID_ARGUMENT message names (`grpo.lora_rank: ...`); CreateLoop's
    `job.<path>` is the job field, its own fields are `loop.<field>`. "" when it names no field of
    the form."""
    m = _FIELD_PATH.match(details)
    if not m:
        return ""
    path = m.group(1)
    if loop:
        path = path.removeprefix("job.") if path.startswith("job.") else f"loop.{path}"
    return path if path in ALL_FIELDS else ""


def field_errors(error: RlvrError, *, loop: bool = False) -> FormErrors:
    """An INVALID_ARGUMENT's errors by form field: each bad field the status's BadRequest details
    name goes next to its input (the whole message when it carries none); one that names no field
    of the form goes above it ("")."""
    out = FormErrors()
    for field_path, description in error.violations or [("", error.details)]:
        text = f"{field_path}: {description}" if field_path else description
        path = error_field(text, loop=loop)
        out[path] = f"{out[path]}\n{text}" if path in out else text
    return out


def lr_presets(low: float | None, high: float | None) -> list[str]:
    """A Learning Rate field's buttons (RLVR's, SFT's): the 1-2-5 values inside the server's range."""
    if low is None or high is None or low <= 0:
        return []
    values = [m * 10.0 ** e for e in range(-9, 0) for m in (1, 2, 5)]
    return [f"{v:.0e}".replace("e-0", "e-") for v in values if low * (1 - 1e-9) <= v <= high * (1 + 1e-9)]
