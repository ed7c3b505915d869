"""New Training: the spec's form (Reward Function card, GRPO Configuration card, Advanced Options,
the Training Summary sidebar with Start Training) and, further down the same form, "Start an
automated loop" (the rounds train with the settings above).

Every number's range, default and the choice labels come from rlvr/jobspec/fields.py's table (clients/web/limits.py).
The server validates every submit: its INVALID_ARGUMENT error goes next to the field it names,
with the values entered kept (answered 200, as form frameworks do: browsers log a 4xx document as a
console error, and the page itself says what is wrong). The Training Summary is a CreateJob dry run of what the form holds
(re-asked as you change a field, with JavaScript), and the batch-size warning beside Batch Size is
the dry run's own warning ("grpo.batch_size 4 is not a multiple of grpo.group_size 8: rounded up
to 8"), so the rounding rule lives only in the scheduler.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rlvr.clients.web import forms, views
from rlvr.clients.web.console import Console, see_other
from rlvr.clients.web.limits import FormLimits
from rlvr.jobspec import APPLIES_NOTES, FIELDS_BY_PATH
from rlvr.peers.base import RlvrError
from rlvr.recipes import MEASURED_RECIPES, MeasuredRecipe, recipe_for
from rlvr.v1 import scheduler_pb2 as S

TEXT_DEFAULTS = ("name", "base_model", "reward.dataset")  # shown as placeholders, sent only when typed
ONLY_NOTES = {**APPLIES_NOTES, "dataset_benchmark": "benchmarks that take a dataset only"}


def card_default(path: str) -> str:
    """An SFT or Head field's default as the form shows it (a dataset: empty, to be given)."""
    value = FIELDS_BY_PATH[path].default_value
    return ("on" if value else "") if isinstance(value, bool) else "" if path.endswith(".dataset") else str(value)


def default_values(limits: FormLimits) -> dict[str, str]:
    """The form as it first shows: every job field at the server's default; the loop's too."""
    values = {f.path: ("" if f.path in TEXT_DEFAULTS else limits.default_text(f.path)) for f in forms.JOB_FIELDS}
    # The SFT and Head cards' unranged fields: the table's defaults (an RLVR spec, the resolved defaults,
    # leaves them unset).
    values.update({f.path: card_default(f.path) for f in forms.SFT + forms.HEAD if f.path not in limits.limits})
    loop = limits.loop_defaults
    values.update({"loop.name": "", "loop.target": "", "loop.min_gain": "", "loop.benchmark_dataset": "",
                   "loop.benchmark": loop.benchmark if loop else "",
                   "loop.score_column": loop.score_column if loop else "",
                   "loop.max_rounds": str(loop.max_rounds) if loop else "",
                   "loop.give_up_after": str(loop.give_up_after) if loop else "",
                   "loop.reclaim_storage": "on" if loop is None or loop.reclaim_storage else "",
                   "loop.best_step": "on" if loop is not None and loop.best_step else "",
                   "loop.benchmark_limit": str(loop.benchmark_limit) if loop else ""})
    return values


def field_messages(warnings: list[str], errors: dict[str, str]) -> dict[str, dict[str, str]]:
    """Messages by field: the errors, and the warnings that start with a field's path."""
    out = {path: {"kind": "error", "text": text} for path, text in errors.items() if path}
    for w in warnings:
        path = w.split(" ", 1)[0].rstrip(":")
        if path in forms.ALL_FIELDS and path not in out:
            out[path] = {"kind": "warning", "text": w}
    return out


def routes(console: Console) -> list[Route]:
    scheduler = console.sdk.scheduler

    def dry_run(values: dict[str, str], limits: FormLimits) -> dict[str, Any]:
        """The Training Summary of what the form holds: summary rows, warnings, or the error."""
        spec, errors = forms.job_spec(values, limits)
        if errors:
            return {"summary": [], "warnings": [], "problem": "; ".join(errors.values()), "errors": errors}
        try:
            resp = scheduler.create_job(S.CreateJobRequest(spec=spec, dry_run=True))
        except RlvrError as e:
            if e.code.name != "INVALID_ARGUMENT":
                raise
            return {"summary": [], "warnings": [], "problem": e.details, "errors": forms.field_errors(e)}
        return {"summary": views.summary(resp.summary), "warnings": list(resp.warnings), "problem": "",
                "errors": {}}

    def render(request: Request, values: dict[str, str], errors: dict[str, str], *,
               limits: FormLimits | None = None, recipe: MeasuredRecipe | None = None) -> Response:
        limits = limits or console.limits.get()
        preview = dry_run(values, limits)
        messages = field_messages(preview["warnings"], preview["errors"])
        messages.update({path: {"kind": "error", "text": text} for path, text in errors.items() if path})
        benchmarks = {b.name: b for b in limits.benchmarks}
        chosen = benchmarks.get(values.get("loop.benchmark", ""))
        return console.page(request, "train.html", {
            "limits": limits, "values": values, "messages": messages, "general": errors.get("", ""),
            "errors": {p: t for p, t in errors.items() if p}, "preview": preview, "forms": forms,
            "benchmarks": limits.benchmarks,
            "columns": list(chosen.score_columns) if chosen else [], "only_notes": ONLY_NOTES,
            "active_options": forms.active_options(values, limits),
            "recipes": list(MEASURED_RECIPES.values()), "recipe": recipe,
        }, active="train")

    def train_page(request: Request) -> Response:
        """The form at the spec's defaults; `?recipe=MODEL` fills it with that model's measured recipe
        (rlvr/recipes.py), saying where its figures come from."""
        limits = console.limits.get()
        values, errors = default_values(limits), {}
        name = request.query_params.get("recipe", "")
        recipe = recipe_for(name) if name else None
        if recipe is not None:
            values.update({path: recipe.text(path) for path in recipe.fields}, base_model=recipe.model)
        elif name:
            errors[""] = (f"no measured recipe for {name!r}; models with one: {', '.join(sorted(MEASURED_RECIPES))}")
        return render(request, values, errors, limits=limits, recipe=recipe)

    def submitted(data: dict[str, str]) -> dict[str, str]:
        # Unchecked boxes send nothing: the submitted form is all there is (no defaults mixed in).
        return {f: data.get(f, "") for f in forms.ALL_FIELDS}

    async def submit(request: Request, *, loop: bool) -> Response:
        """Start Training (a job) or Start loop: the form's spec to the scheduler, then its page; a
        refused value is shown next to the field the scheduler's message names."""
        data = await console.form(request)
        limits = await run_in_threadpool(console.limits.get)
        values = submitted(data)
        spec, errors = (forms.loop_spec if loop else forms.job_spec)(values, limits)
        if not errors:
            try:
                if loop:
                    resp = await run_in_threadpool(scheduler.create_loop, S.CreateLoopRequest(spec=spec))
                    return see_other(f"/loops/{resp.loop.id}")
                created = await run_in_threadpool(scheduler.create_job, S.CreateJobRequest(spec=spec))
                return see_other(f"/jobs/{created.job.id}")
            except RlvrError as e:
                if e.code.name != "INVALID_ARGUMENT":
                    raise
                errors = forms.field_errors(e, loop=loop)
        return await run_in_threadpool(lambda: render(request, values, errors, limits=limits))

    async def start_training(request: Request) -> Response:
        return await submit(request, loop=False)

    async def start_loop(request: Request) -> Response:
        return await submit(request, loop=True)

    async def summary(request: Request) -> Response:
        """The sidebar and the per-field messages for what the form holds now (a dry run)."""
        data = await console.form(request)
        limits = await run_in_threadpool(console.limits.get)
        values = submitted(data)
        preview = await run_in_threadpool(dry_run, values, limits)
        html = console.fragment("train/_summary.html", {"preview": preview})
        return JSONResponse({"sidebar": html, "messages": field_messages(preview["warnings"], preview["errors"])})

    return [
        Route("/train", train_page),
        Route("/train", start_training, methods=["POST"]),
        Route("/train/summary", summary, methods=["POST"]),
        Route("/loops", start_loop, methods=["POST"]),
        Route("/loops/new", lambda request: see_other("/train#loop")),
    ]
