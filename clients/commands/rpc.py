"""The generated half of the `rlvr` CLI: `rlvr call <service> <Method> [JSON]` for every RPC.

Nothing here names an RPC. The commands are built by walking the service descriptors of the
generated v1 modules, and calls go through generic multicallables built from the same
descriptors, so an RPC added to the protos is callable from the shell (with its help) without
new CLI code. Requests are JSON (protobuf's JSON mapping, proto field names or lowerCamelCase);
responses print as JSON with proto field names and default values; a server stream prints one
JSON document per line; a client stream takes a JSON array of requests.

Exit codes: 0 success, 1 the call failed (`error: <CODE>: <details>`), 2 a bad request (one
line naming the field) or bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from rlvr.clients.proto_docs import (
    describe_message,
    is_real_oneof_member,
    method_signature,
    proto_comments,
    summary,
)
from rlvr.common.client import CONTRACT_MODULES, DEFAULT_ADDRESSES, SERVICE_NAMES, deadline_for


def _formatter(prog: str) -> argparse.HelpFormatter:
    # Raw: the proto comments and the field tree keep their line breaks. A wider help column keeps
    # RPC names such as GetEvaluationResults on the line of their summary.
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=28)


_INT_TYPES = {
    getattr(FieldDescriptor, f"TYPE_{name}")
    for name in (
        "INT32",
        "INT64",
        "UINT32",
        "UINT64",
        "SINT32",
        "SINT64",
        "FIXED32",
        "FIXED64",
        "SFIXED32",
        "SFIXED64",
    )
}
_FLOAT_TYPES = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}
_JSON_NOTE = (
    "JSON: proto field names (or lowerCamelCase); enums by name or number; 64-bit integers as numbers\n"
    "or strings (responses print them as strings); bytes as base64; unset fields take their default."
)


class RequestError(ValueError):
    """A request the CLI cannot send; the message is one line naming the field."""


def services() -> dict[str, ServiceDescriptor]:
    """Short name -> descriptor of every v1 service, from the generated modules."""
    by_full_name = {
        service.full_name: service
        for module in CONTRACT_MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
    }
    return {short: by_full_name[full] for short, full in SERVICE_NAMES.items()}


def method_name(method: MethodDescriptor) -> str:
    """The name deadlines and retries are keyed by, e.g. "rlvr.v1.RewardService/Score"."""
    return f"{method.containing_service.full_name}/{method.name}"


def _shape(method: MethodDescriptor) -> str:
    if method.client_streaming and method.server_streaming:
        return "bidi stream"
    if method.client_streaming:
        return "client stream: a JSON array of requests"
    return "server stream: JSON lines" if method.server_streaming else "unary"


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


# ---------------------------------------------------------------- the parser


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `call` with one subcommand per service and one per RPC."""
    comments = proto_comments()
    call = subparsers.add_parser(
        "call",
        help="call any RPC of any service, JSON in and out",
        description="Calls any RPC of the rlvr v1 contract with a JSON request and prints the response "
        "as JSON.\nExamples:\n  rlvr call reward ListRewardFunctions\n"
        '  rlvr call scheduler GetJob \'{"id": "job-1"}\'\n  rlvr call rollout Generate @request.json',
        formatter_class=_formatter,
    )
    call.set_defaults(handler=_usage(call))
    by_service = call.add_subparsers(title="services", metavar="SERVICE")
    for short, service in services().items():
        comment = comments.get(service.full_name, "")
        # "The rollout service: a dedicated generation server." -> "A dedicated generation server."
        about = re.sub(r"^The \w+ service:\s*", "", " ".join(comment.split()))
        service_parser = by_service.add_parser(
            short,
            help=summary(about[:1].upper() + about[1:], 64) or service.full_name,
            description=f"{service.full_name}\n\n{comment}".strip(),
            formatter_class=_formatter,
        )
        service_parser.set_defaults(handler=_usage(service_parser))
        by_method = service_parser.add_subparsers(title="RPCs", metavar="METHOD")
        for method in service.methods:
            _add_method(by_method, short, method, comments.get(method.full_name, ""))


def _add_method(
    subparsers: argparse._SubParsersAction, short: str, method: MethodDescriptor, comment: str
) -> None:
    full = method_name(method)
    request = method.input_type
    what = (
        f"a JSON array of {request.full_name}" if method.client_streaming else f"a JSON {request.full_name}"
    )
    parser = subparsers.add_parser(
        method.name,
        help=f"{summary(comment, 64) or method_signature(method)} [{_shape(method)}]",
        description=f"{full}: {method_signature(method)}\n\n{comment}".strip(),
        epilog=f"request {request.full_name}:\n{describe_message(request)}\n\n{_JSON_NOTE}",
        formatter_class=_formatter,
    )
    parser.add_argument(
        "json", nargs="?", metavar="JSON", help=f"the request: {what}, @FILE, or - for stdin (default: empty)"
    )
    parser.add_argument("-d", "--data", metavar="JSON", help="the request, as an option")
    env = f"RLVR_{short.upper()}_ADDRESS"
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help=f"the {short} service (default: ${env}, else {DEFAULT_ADDRESSES[short]})",
    )
    parser.add_argument(
        "--timeout",
        type=_positive,
        metavar="S",
        help=f"deadline in seconds (default: {deadline_for(full):g}, or $RLVR_TIMEOUT for unary calls)",
    )
    parser.set_defaults(handler=run_call, service=short, method=method, command_parser=parser)


def _usage(parser: argparse.ArgumentParser) -> Any:
    def handler(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return handler


# ---------------------------------------------------------------- requests


def read_request_text(args: argparse.Namespace) -> str | None:
    """The request text from the JSON argument, -d, @FILE or stdin; None when none was given."""
    if args.json is not None and args.data is not None:
        raise RequestError("give the request once: as the JSON argument or with -d, not both")
    text = args.data if args.data is not None else args.json
    if text == "-":
        return sys.stdin.read()
    if text is not None and text.startswith("@"):
        path = Path(text[1:])
        try:
            return path.read_text()
        except OSError as e:
            raise RequestError(f"cannot read request file {path}: {e.strerror}") from None
    return text


def _where(path: str) -> str:
    return f'"{path}"' if path else "the request"


def _check_value(value: Any, field: FieldDescriptor, path: str) -> None:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if not field.message_type.full_name.startswith("google.protobuf."):
            check_json(value, field.message_type, path)
        return
    if kind == FieldDescriptor.TYPE_ENUM:
        names = [v.name for v in field.enum_type.values]
        if isinstance(value, str) and value not in names:
            raise RequestError(
                f'field "{path}": unknown value "{value}" for {field.enum_type.full_name}; '
                f"one of: {', '.join(names)}"
            )
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise RequestError(f'field "{path}": expected an enum name or number, got {json.dumps(value)}')
        return
    ok = {
        FieldDescriptor.TYPE_BOOL: isinstance(value, bool),
        FieldDescriptor.TYPE_STRING: isinstance(value, str),
        FieldDescriptor.TYPE_BYTES: isinstance(value, str),
    }.get(kind)
    if kind in _INT_TYPES:
        ok = (
            (isinstance(value, int) and not isinstance(value, bool))
            or (isinstance(value, float) and value.is_integer())
            or (isinstance(value, str) and _is_number(value))
        )
    elif kind in _FLOAT_TYPES:
        ok = (isinstance(value, int | float) and not isinstance(value, bool)) or (
            isinstance(value, str) and _is_number(value)
        )
    if ok is False:
        expected = "base64 string" if kind == FieldDescriptor.TYPE_BYTES else _type_word(kind)
        raise RequestError(f'field "{path}": expected {expected}, got {json.dumps(value)}')


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _type_word(kind: int) -> str:
    if kind in _INT_TYPES:
        return "an integer"
    if kind in _FLOAT_TYPES:
        return "a number"
    return "true or false" if kind == FieldDescriptor.TYPE_BOOL else "a string"


def check_json(value: Any, message: Descriptor, path: str = "") -> None:
    """Checks decoded JSON against a message descriptor; raises RequestError naming the first
    bad field by its path ("items[0].completion"). protobuf's own parser reports the same
    problems, but in messages that do not always name the field."""
    if not isinstance(value, dict):
        raise RequestError(
            f"{_where(path)}: expected a JSON object ({message.full_name}), got {json.dumps(value)}"
        )
    fields = {f.name: f for f in message.fields} | {f.json_name: f for f in message.fields}
    oneof_set: dict[str, str] = {}
    for key, item in value.items():
        field_path = f"{path}.{key}" if path else key
        field = fields.get(key)
        if field is None:
            known = ", ".join(f.name for f in message.fields) or "no fields"
            raise RequestError(f'unknown field "{field_path}" ({message.full_name} has: {known})')
        if item is None:  # JSON null = unset
            continue
        if is_real_oneof_member(field):
            group = field.containing_oneof.name
            if group in oneof_set:
                raise RequestError(
                    f'fields "{oneof_set[group]}" and "{field_path}" are both set; they are '
                    f'alternatives of "{group}", set one'
                )
            oneof_set[group] = field_path
        if field.is_repeated and field.message_type is not None and field.message_type.GetOptions().map_entry:
            if not isinstance(item, dict):
                raise RequestError(
                    f'field "{field_path}": expected a JSON object (a map), got {json.dumps(item)}'
                )
            value_field = field.message_type.fields_by_name["value"]
            for map_key, map_value in item.items():
                _check_value(map_value, value_field, f"{field_path}[{json.dumps(map_key)}]")
        elif field.is_repeated:
            if not isinstance(item, list):
                raise RequestError(f'field "{field_path}": expected a JSON array, got {json.dumps(item)}')
            for index, element in enumerate(item):
                _check_value(element, field, f"{field_path}[{index}]")
        else:
            _check_value(item, field, field_path)


def parse_request(value: Any, message: Descriptor, path: str = "") -> Message:
    """A request message from decoded JSON; RequestError (one line, naming the field) if bad."""
    check_json(value, message, path)
    request = message_factory.GetMessageClass(message)()
    try:
        json_format.ParseDict(value, request)
    except json_format.ParseError as e:  # what check_json does not cover, e.g. an int32 overflow
        raise RequestError(str(e).splitlines()[0]) from None
    return request


def build_requests(method: MethodDescriptor, text: str | None) -> list[Message]:
    """The request(s) of a call: one message, or for a client stream one per array element."""
    if text is None or not text.strip():
        data: Any = [] if method.client_streaming else {}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise RequestError(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not method.client_streaming:
        return [parse_request(data, method.input_type)]
    if not isinstance(data, list):
        raise RequestError(
            f"{method.name} is a client stream: expected a JSON array of "
            f"{method.input_type.full_name}, got {type(data).__name__}"
        )
    return [parse_request(item, method.input_type, f"[{index}]") for index, item in enumerate(data)]


# ---------------------------------------------------------------- calls


def invoke(
    channel: Any, method: MethodDescriptor, requests: list[Message], timeout: float
) -> Iterator[Message]:
    """Calls `method` on `channel` through a generic multicallable; yields each response."""
    path = "/" + method_name(method)
    serialize = message_factory.GetMessageClass(method.input_type).SerializeToString
    deserialize = message_factory.GetMessageClass(method.output_type).FromString
    if method.client_streaming:
        make = channel.stream_stream if method.server_streaming else channel.stream_unary
        argument: Any = iter(requests)
    else:
        make = channel.unary_stream if method.server_streaming else channel.unary_unary
        argument = requests[0]
    call = make(path, request_serializer=serialize, response_deserializer=deserialize)(
        argument, timeout=timeout
    )
    if not method.server_streaming:
        yield call
        return
    try:
        yield from call
    finally:
        call.cancel()  # stop the server's stream when output stops early (a closed pipe, ^C)


def _in_field_order(value: Any, message: Descriptor) -> Any:
    """MessageToDict lists the set fields first, then the defaults; put them back in the order
    of the proto, so every response of a kind reads (and diffs) the same."""
    ordered = {}
    for field in message.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        sub = field.message_type
        if sub is not None and not sub.GetOptions().map_entry and not sub.full_name.startswith("google."):
            item = (
                [_in_field_order(v, sub) for v in item] if field.is_repeated else _in_field_order(item, sub)
            )
        ordered[field.name] = item
    return ordered


def to_json(message: Message, *, indent: int | None) -> str:
    """A response as proto3 JSON: proto field names, default values included."""
    value = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(_in_field_order(value, message.DESCRIPTOR), indent=indent)


def run_call(args: argparse.Namespace) -> int:
    """The handler of every `rlvr call <service> <Method>`."""
    import grpc
    from pydantic import ValidationError

    from rlvr.clients.sdk import ClientSettings, default_timeout
    from rlvr.common.client import make_channel
    from rlvr.common.settings import SettingsError

    method: MethodDescriptor = args.method
    try:
        requests = build_requests(method, read_request_text(args))
    except RequestError as e:
        print(f"error: invalid request for {method_name(method)}: {e}", file=sys.stderr)
        return 2
    try:
        settings = ClientSettings(**({f"{args.service}_address": args.address} if args.address else {}))
        auth = settings.auth(args.service)
    except ValidationError as e:
        first = e.errors()[0]
        print(f"error: setting RLVR_{str(first['loc'][0]).upper()}: {first['msg']}", file=sys.stderr)
        return 2
    except SettingsError as e:  # an unreadable CA or certificate file
        print(f"error: {e}", file=sys.stderr)
        return 2
    address = settings.address(args.service)
    timeout = args.timeout or default_timeout(method_name(method), settings.timeout)
    indent = None if method.server_streaming else 2
    with make_channel(address, auth=auth) as channel:
        responses = invoke(channel, method, requests, timeout)
        try:
            for response in responses:
                sys.stdout.write(to_json(response, indent=indent) + "\n")
                sys.stdout.flush()  # a watcher piped into jq sees each event as it comes
        except grpc.RpcError as e:
            from rlvr.clients.errors import explain, is_unreachable, unreachable
            from rlvr.peers.base import RlvrError

            error = RlvrError.from_rpc(e, method_name(method), address)
            print("error: " + (unreachable(args.service, address, error.details, settings.origin(args.service))
                               if is_unreachable(error) else explain(error)), file=sys.stderr)
            return 1
        except BrokenPipeError:
            responses.close()
            # The reader went away (`| head`): not an error. Point stdout at devnull so the
            # interpreter's final flush does not complain either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
