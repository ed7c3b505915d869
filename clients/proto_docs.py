"""Help text for the generated CLI: the comments of the .proto files, and request field trees.

The generated `_pb2` modules carry no comments (protoc drops source info from Python stubs), so
the comments are read from `protos/rlvr/v1/*.proto` next to the package, with a small
line-based reader that understands the subset of proto3 the contract uses. Where the protos are
not shipped (a wheel without them) the help simply has no comments.
"""

from __future__ import annotations

import functools
import re
import textwrap
from pathlib import Path

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, MethodDescriptor

PROTO_DIR = Path(__file__).resolve().parent.parent / "protos"

_BLOCK = re.compile(r"^\s*(message|service|enum|oneof)\s+(\w+)\s*\{")
_RPC = re.compile(r"^\s*rpc\s+(\w+)\s*\(")
_FIELD = re.compile(r"^\s*(?:optional\s+|repeated\s+)?(?:map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*\d+")
_ENUM_VALUE = re.compile(r"^\s*(\w+)\s*=\s*-?\d+")
_TRAILING = re.compile(r";\s*//\s?(.*)$")


def parse_proto_comments(text: str) -> dict[str, str]:
    """Comments by full name ("rlvr.v1.RolloutService.Generate", "rlvr.v1.GenerateRequest.n",
    "rlvr.v1.FinishReason.FINISH_REASON_STOP"): the `//` lines right above a declaration, then
    a comment on the same line. A service without its own comment gets the file's header."""
    comments: dict[str, str] = {}
    package = ""
    header: list[str] = []
    pending: list[str] = []
    scopes: list[tuple[str, str]] = []  # (kind, name); oneofs do not add to field names
    seen_code = False

    def record(key: str, extra: str = "") -> None:
        # Line breaks are kept: a comment may hold a table (benchmark.proto's score columns).
        parts = [*pending, extra] if extra else pending
        text = "\n".join(p.removeprefix(" ").rstrip() for p in parts).strip()
        if text:
            comments[key] = text

    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("//"):
            (pending if seen_code else header).append(line[2:])
            continue
        if not line:
            pending = []
            continue
        seen_code = True
        names = [n for k, n in scopes if k != "oneof"]
        prefix = ".".join([package, *names]) if package else ".".join(names)
        trailing = _TRAILING.search(line)
        extra = trailing.group(1) if trailing else ""
        if line.startswith("package "):
            package = line.removeprefix("package ").rstrip(";").strip()
        elif m := _BLOCK.match(line):
            kind, name = m.groups()
            if kind != "oneof":
                record(f"{prefix}.{name}" if prefix else name)
                if kind == "service" and f"{prefix}.{name}" not in comments:
                    comments[f"{prefix}.{name}"] = "\n".join(
                        h.removeprefix(" ").rstrip() for h in header
                    ).strip()
            scopes.append((kind, name))
            if line.endswith("}"):  # message Empty {}
                scopes.pop()
        elif line.startswith("}"):
            if scopes:
                scopes.pop()
        elif (m := _RPC.match(line)) and scopes and scopes[-1][0] == "service":
            record(f"{prefix}.{m.group(1)}")
        elif scopes and (m := (_ENUM_VALUE if scopes[-1][0] == "enum" else _FIELD).match(line)):
            record(f"{prefix}.{m.group(1)}", extra)
        pending = []
    return comments


@functools.cache
def proto_comments() -> dict[str, str]:
    """The comments of every proto under PROTO_DIR (empty when the protos are not there)."""
    comments: dict[str, str] = {}
    for path in sorted(PROTO_DIR.glob("**/*.proto")):
        comments.update(parse_proto_comments(path.read_text()))
    return comments


def summary(text: str, width: int = 90) -> str:
    """The opening sentence of a comment, shortened to `width`, for one-line listings."""
    flat = one_line(text)
    m = re.match(r"(.+?\.)(\s|$)", flat)
    return textwrap.shorten(m.group(1) if m else flat, width, placeholder=" ...")


def one_line(text: str) -> str:
    return " ".join(text.split())


def _scalar_names() -> dict[int, str]:
    return {getattr(FieldDescriptor, n): n[5:].lower() for n in dir(FieldDescriptor) if n.startswith("TYPE_")}


_SCALARS = _scalar_names()


def method_signature(method: MethodDescriptor) -> str:
    """The call's shape, e.g. "GenerateRequest -> stream GenerateResponse"."""
    request = ("stream " if method.client_streaming else "") + method.input_type.name
    response = ("stream " if method.server_streaming else "") + method.output_type.name
    return f"{request} -> {response}"


def is_real_oneof_member(field: FieldDescriptor) -> bool:
    """True for a member of a declared oneof; False for proto3 `optional` (a synthetic oneof)."""
    oneof = field.containing_oneof
    return oneof is not None and not (len(oneof.fields) == 1 and oneof.name == f"_{field.name}")


def type_label(field: FieldDescriptor) -> str:
    """The field's type as the help shows it, e.g. "repeated rlvr.v1.Prompt", "optional int32"."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name == "google.protobuf.Timestamp":
            name = 'timestamp (RFC 3339 string, e.g. "2025-01-31T12:00:00Z")'
    elif field.type == FieldDescriptor.TYPE_ENUM:
        name = f"enum {field.enum_type.full_name}"
    elif field.type == FieldDescriptor.TYPE_BYTES:
        name = "bytes (base64)"
    else:
        name = _SCALARS.get(field.type, "?")
    if field.is_repeated:
        return f"repeated {name}"
    if field.has_presence and field.type != FieldDescriptor.TYPE_MESSAGE and not is_real_oneof_member(field):
        return f"optional {name}"
    return name


def enum_values(enum: EnumDescriptor) -> str:
    return ", ".join(v.name for v in enum.values)


def describe_message(desc: Descriptor, *, width: int = 100) -> str:
    """The request's fields, recursively, with types, enum values and the proto comments."""
    comments = proto_comments()
    lines: list[str] = []

    def walk(message: Descriptor, depth: int, path: tuple[str, ...]) -> None:
        pad = "  " * depth
        oneof_seen: set[str] = set()
        for field in message.fields:
            if is_real_oneof_member(field) and field.containing_oneof.name not in oneof_seen:
                oneof_seen.add(field.containing_oneof.name)
                members = ", ".join(f.name for f in field.containing_oneof.fields)
                lines.append(f"{pad}(set one of: {members})")
            lines.append(f"{pad}{field.name}: {type_label(field)}")
            sub_pad = pad + "    "
            comment = one_line(comments.get(field.full_name, ""))
            if comment:
                lines.extend(textwrap.wrap(comment, width, initial_indent=sub_pad, subsequent_indent=sub_pad))
            if field.type == FieldDescriptor.TYPE_ENUM:
                lines.extend(
                    textwrap.wrap(
                        "values: " + enum_values(field.enum_type),
                        width,
                        initial_indent=sub_pad,
                        subsequent_indent=sub_pad + "  ",
                    )
                )
            sub = field.message_type
            if sub is not None and not sub.full_name.startswith("google.protobuf."):
                if sub.full_name in path:
                    lines.append(f"{sub_pad}(recursive: {sub.full_name})")
                else:
                    walk(sub, depth + 1, (*path, sub.full_name))

    walk(desc, 1, (desc.full_name,))
    if not lines:
        lines.append("  (no fields: send {})")
    return "\n".join(lines)
