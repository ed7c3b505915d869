"""`rlvr events tail`: follow the RLVR stream on NATS, decoded, one line per event.

The NATS URL comes from `--nats-url`, else `RLVR_NATS_URL`, else the running local stack's
`<home>/nats.json` (`rlvr up` runs its NATS on a free port with a password made at each start,
and writes the URL with its credentials there, readable by its owner only). The password is never
printed: every URL shown has `***` in its place.

    rlvr events tail                   # every new event of every job, loop and evaluation
    rlvr events tail --job ID          # one job's metrics and statuses: its history, then live
    rlvr events tail --loop ID | --eval ID | --subject 'rlvr.jobs.*.status'
    rlvr events tail --job ID --json   # one JSON object per line (the contract's field names)

Ctrl-C stops it; `--count N` stops after N events. Needs nats-py (`pip install 'rlvr[server]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from rlvr.v1 import benchmark_pb2, common_pb2, scheduler_pb2

STREAM = "RLVR"
# subject pattern (by its first and last token) -> the contract message its payload is
MESSAGES: dict[tuple[str, str], type[Message]] = {
    ("jobs", "metrics"): common_pb2.MetricEvent,
    ("jobs", "status"): common_pb2.JobStatusEvent,
    ("evals", "status"): benchmark_pb2.EvaluationEvent,
    ("loops", "status"): scheduler_pb2.LoopStatusEvent,
}


class EventsError(RuntimeError):
    """No NATS URL, or NATS refused: one line saying what to do."""


def nats_url(args: argparse.Namespace) -> str:
    """The URL to connect to, with its credentials (see the module's doc)."""
    from rlvr.clients.connection import read_stack_file, stack_home

    if args.nats_url:
        return str(args.nats_url)
    if os.environ.get("RLVR_NATS_URL"):
        return os.environ["RLVR_NATS_URL"]
    home = Path(args.home).expanduser() if args.home else stack_home()
    state = read_stack_file(home)
    if state is None:
        raise EventsError(f"no local stack runs (no {home / 'stack.json'}): start one with `rlvr up`, or give "
                          "the NATS URL with --nats-url nats://USER:PASSWORD@HOST:PORT or RLVR_NATS_URL")
    secret = Path(str(state.get("nats_file") or home / "nats.json"))
    try:
        url = json.loads(secret.read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        raise EventsError(f"cannot read the stack's NATS URL from {secret} (it is the stack owner's, 0600)") from None
    return str(url)


def subject_of(args: argparse.Namespace) -> str:
    for kind, value in (("jobs", args.job), ("loops", args.loop), ("evals", args.eval)):
        if value:
            from rlvr.infra.subjects import SUBJECT_TOKEN_RE

            if not SUBJECT_TOKEN_RE.match(value):
                raise EventsError(f"--{kind.rstrip('s')}: {value!r} is not an id (letters, digits, _ and -)")
            return f"rlvr.{kind}.{value}.>"
    return args.subject or "rlvr.>"


def decode(subject: str, data: bytes) -> Message | None:
    """The event as its contract message, or None for a subject or payload this does not know."""
    parts = subject.split(".")
    cls = MESSAGES.get((parts[1], parts[-1])) if len(parts) >= 4 else None
    if len(parts) == 5 and parts[1] == "jobs" and parts[3] == "samples":  # rlvr.jobs.<id>.samples.<step>
        cls = common_pb2.CompletionSamples
    if cls is None:
        return None
    try:
        return cls.FromString(data)
    except DecodeError:
        return None


def _enum(message: Message, field: str) -> str:
    value = getattr(message, field)
    name = message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number.get(value)
    return name.name.split("_STATUS_")[-1] if name is not None else str(value)


def line_of(subject: str, seq: int, message: Message | None, data: bytes) -> str:
    """One event in words: what happened, to which job, loop or evaluation."""
    if isinstance(message, common_pb2.MetricEvent):
        m = message
        extras = "".join(f" {k} {getattr(m, k):.4g}" for k in ("kl", "entropy", "heldout_loss") if m.HasField(k))
        if m.HasField("token_accuracy"):  # a Supervised (SFT) job's step: no reward
            return (f"#{seq} job {m.job_id} step {m.step}/{m.total_steps or '?'}: loss {m.loss:.4g} token accuracy "
                    f"{m.token_accuracy:.3f}{extras}")
        if m.HasField("tokens_per_second"):  # a Head job's step (tokens, no token accuracy): no reward either
            scores = "".join(f" held-out {k} {getattr(m, f):.3f}" for k, f in (("accuracy", "heldout_accuracy"),
                                                                              ("F1", "heldout_f1")) if m.HasField(f))
            return f"#{seq} job {m.job_id} step {m.step}/{m.total_steps or '?'}: loss {m.loss:.4g}{scores}{extras}"
        return (f"#{seq} job {m.job_id} step {m.step}/{m.total_steps or '?'}: reward {m.reward_mean:.3f} accuracy "
                f"{m.accuracy:.3f} format {m.format:.3f} loss {m.loss:.4g}{extras} (adapter v{m.adapter_version})")
    if isinstance(message, common_pb2.JobStatusEvent):
        return f"#{seq} job {message.job_id} {_enum(message, 'status')}" + (f": {message.message}" if message.message else "")
    if isinstance(message, benchmark_pb2.EvaluationEvent):
        e = message
        return (f"#{seq} evaluation {e.evaluation_id} {_enum(e, 'status')} {e.questions_done}/{e.questions_total}: "
                f"accuracy {e.scores.accuracy:.1%}" + (f" ({e.message})" if e.message else ""))
    if isinstance(message, common_pb2.CompletionSamples):
        return f"#{seq} job {message.job_id} step {message.step} samples: {len(message.samples)} completion(s)"
    if isinstance(message, scheduler_pb2.LoopStatusEvent):
        score = f" score {message.score:.1f}%" if message.HasField("score") else ""
        return (f"#{seq} loop {message.loop_id} round {message.round} {_enum(message, 'status')}{score}"
                + (f": {message.message}" if message.message else ""))
    return f"#{seq} {subject}: {len(data)} bytes"


def json_of(subject: str, seq: int, message: Message | None, data: bytes) -> str:
    body: dict[str, Any] = {"subject": subject, "seq": seq}
    if message is not None:
        body["type"] = message.DESCRIPTOR.name
        body["event"] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    else:
        body["bytes"] = len(data)
    return json.dumps(body)


async def tail(url: str, subject: str, *, from_start: bool, count: int, as_json: bool, out: TextIO) -> int:
    """Prints the events on `subject` until Ctrl-C or `count` of them; 0, or 1 when NATS refused."""
    import nats
    import nats.errors
    from nats.js.api import DeliverPolicy

    from rlvr.infra.events import redact_url

    try:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0, allow_reconnect=False)
    except (OSError, nats.errors.Error) as e:
        raise EventsError(f"cannot connect to NATS at {redact_url(url)}: {e or type(e).__name__} (is the stack "
                          "running? `rlvr status` shows its NATS)") from None
    try:
        js = nc.jetstream()
        policy = DeliverPolicy.ALL if from_start else DeliverPolicy.NEW
        try:
            sub = await js.subscribe(subject, stream=STREAM, ordered_consumer=True, deliver_policy=policy)
        except nats.errors.Error as e:
            raise EventsError(f"cannot follow {subject} on NATS at {redact_url(url)}: {e}") from None
        seen = 0
        while not count or seen < count:
            msg = await sub.next_msg(timeout=None)
            seq = msg.metadata.sequence.stream if msg.metadata is not None else 0
            message = decode(msg.subject, msg.data)
            print((json_of if as_json else line_of)(msg.subject, seq, message, msg.data), file=out, flush=True)
            seen += 1
        return 0
    finally:
        await nc.close()


def cmd_tail(args: argparse.Namespace) -> int:
    try:
        subject, url = subject_of(args), nats_url(args)
        from_start = args.from_start or bool(args.job or args.loop or args.eval)
        return asyncio.run(tail(url, subject, from_start=from_start and not args.new, count=args.count,
                                as_json=args.json, out=sys.stdout))
    except EventsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    events = subparsers.add_parser("events", help="follow the NATS event stream (jobs, loops, evaluations)",
                                   description=__doc__.split("\n\n")[0])
    sub = events.add_subparsers(dest="events_command", required=True)
    t = sub.add_parser("tail", help="print events as they come, decoded (the local stack's NATS by default)",
                       description="Prints one line per event of the RLVR stream. With --job, --loop or --eval the "
                       "history first, then live; otherwise only new events (--from-start replays the stream).")
    which = t.add_mutually_exclusive_group()
    which.add_argument("--job", default="", help="one job's metrics and statuses")
    which.add_argument("--loop", default="", help="one loop's statuses")
    which.add_argument("--eval", default="", help="one evaluation's progress")
    which.add_argument("--subject", default="", help="a NATS subject (wildcards allowed; default rlvr.>)")
    t.add_argument("--from-start", action="store_true", help="replay the stream's history first")
    t.add_argument("--new", action="store_true", help="only new events, also with --job/--loop/--eval")
    t.add_argument("--count", type=int, default=0, help="stop after N events (default: until Ctrl-C)")
    t.add_argument("--json", action="store_true", help="one JSON object per line")
    t.add_argument("--nats-url", default="", help="NATS URL (default RLVR_NATS_URL, else the local stack's nats.json)")
    t.add_argument("--home", default="", help="the local stack's state folder (default $RLVR_HOME/stack)")
    t.set_defaults(handler=cmd_tail)
