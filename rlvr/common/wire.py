"""Why a request's bytes do not decode, naming the field where the wire format allows.

protobuf's parser says only "Error parsing message"; the services answer INVALID_ARGUMENT with the
field at fault. `undecodable_field` walks the wire format against the message's descriptor and
returns the path of the first string field that is not UTF-8 (e.g. `prompts[0].text`), or of the
field where the bytes break off; "request" when no field can be told.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


class _Broken(Exception):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path, self.why = path, why


def _varint(data: bytes, pos: int, path: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Broken(path, "truncated or malformed varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


def _walk(data: bytes, descriptor: Descriptor | None, path: str) -> None:
    pos, counts = 0, dict[int, int]()
    while pos < len(data):
        key, pos = _varint(data, pos, path or "request")
        number, wire = key >> 3, key & 7
        field = descriptor.fields_by_number.get(number) if descriptor is not None else None
        name = f"{path}.{field.name}" if path and field else (field.name if field else (path or "request"))
        if field is not None and field.is_repeated:
            index = counts.get(number, 0)
            counts[number] = index + 1
            name = f"{name}[{index}]"
        if number == 0:
            raise _Broken(name, "field number 0")
        if wire == 0:
            _, pos = _varint(data, pos, name)
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
            if pos > len(data):
                raise _Broken(name, "truncated")
        elif wire == 2:
            length, pos = _varint(data, pos, name)
            end = pos + length
            if end > len(data):
                raise _Broken(name, "truncated")
            chunk = data[pos:end]
            pos = end
            if field is not None and field.type == _STRING:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError:
                    raise _Broken(name, "not valid UTF-8") from None
            elif field is not None and field.type == _MESSAGE:
                _walk(chunk, field.message_type, name)
        elif wire in (3, 4):
            raise _Broken(name, "group wire types are not used by this API")
        else:
            raise _Broken(name, f"invalid wire type {wire}")


def undecodable_field(data: bytes, descriptor: Descriptor) -> tuple[str, str]:
    """(field path, reason) for bytes that do not parse as `descriptor`'s message."""
    try:
        _walk(data, descriptor, "")
    except _Broken as e:
        return e.path, e.why
    except Exception:  # noqa: BLE001 (a diagnosis only: never let it turn bad input into INTERNAL)
        pass
    return "request", f"not a valid {descriptor.full_name} message"
