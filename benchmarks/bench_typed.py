"""What a typed decode of the events would save the core: the benchmark's probe of Performance 5's
"typed once" (``safepoint bench --phases core`` reports it beside the core ratio).

One ``msgspec.json.Decoder`` for the union of msgspec structs made from the events' JSON Schemas
(``schemas/events/``) when this module is imported, one per event type whose schema uses only what
a struct can say exactly, tagged by ``type``: it decodes and validates a message in one pass in C,
where the core's ``parse`` decodes a map and then runs the compiled quick test on it. The probe
times, over the same lines, one after the other (best of three each): ``parse``; the typed decode
alone (what the core would pay if its rules read the structs' attributes); and the typed decode
made back into the map the rules read today (``msgspec.to_builtins``).

The decoder is sure, not complete: what it decodes the reference parser (``json``'s decoder and the
schema's full validator) accepts, with the same fields and values of the same types, and anything
else it refuses, for ``parse``'s own way to decide (``tests/unit/test_typed_decode.py`` holds it to
that at every bound of every field and on generated events): a field no schema names (``log_ms``
of a replay file too), a number with a fraction, a value out of range, a type it has no struct for.

What a struct says exactly: ``const`` (``v``; ``type``, the tag), ``type`` integer, string and boolean
with ``minimum``/``maximum``, ``minLength``/``maxLength`` and ``pattern``, ``enum`` of strings; arrays
(``items``, ``maxItems``); objects with ``properties`` and ``required`` (nested structs, unknown fields
refused); ``oneOf`` of an integer, a string, a boolean and null. Anything else (``number``, whose ints
msgspec would make floats; maps; another ``oneOf``; a keyword not listed) leaves the event type out.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from safepoint.schemas import EVENT_TYPES, load

__all__ = ["DECODER", "TYPED", "to_record", "typed_decode_cost"]

_IGNORED = frozenset({"description", "title", "$schema", "$id", "$comment"})


class _Unsupported(Exception):
    """A schema keyword or shape a struct cannot say exactly."""


def _check(schema: dict[str, Any], allowed: set[str]) -> None:
    extra = set(schema) - allowed - _IGNORED
    if extra:
        raise _Unsupported(sorted(extra))


def _field_type(schema: Any, name: str) -> Any:
    """The msgspec type that accepts exactly what ``schema`` accepts (raises ``_Unsupported``)."""
    if not isinstance(schema, dict):
        raise _Unsupported(schema)
    if "oneOf" in schema:
        _check(schema, {"oneOf"})
        kinds = [s.get("type") if isinstance(s, dict) else None for s in schema["oneOf"]]
        if len(set(kinds)) != len(kinds) or not set(kinds) <= {"integer", "string", "boolean", "null"}:
            raise _Unsupported(kinds)  # only alternatives no value can meet twice
        return Union[tuple(_field_type(s, name) for s in schema["oneOf"])]  # noqa: UP007 - built at run time
    if "const" in schema:
        _check(schema, {"const"})
        value = schema["const"]
        if type(value) not in (int, str):
            raise _Unsupported(value)
        return Literal[value]
    kind = schema.get("type")
    if "enum" in schema:
        _check(schema, {"type", "enum"})
        values = schema["enum"]
        if kind not in (None, "string") or not values or not all(type(v) is str for v in values):
            raise _Unsupported(values)
        return Literal[tuple(values)]
    if kind == "integer":
        _check(schema, {"type", "minimum", "maximum"})
        return Annotated[int, Meta(ge=schema.get("minimum"), le=schema.get("maximum"))]
    if kind == "string":
        _check(schema, {"type", "minLength", "maxLength", "pattern"})
        pattern = schema.get("pattern")
        if pattern is not None:
            re.compile(pattern)
        return Annotated[str, Meta(min_length=schema.get("minLength"), max_length=schema.get("maxLength"),
                                   pattern=pattern)]
    if kind == "boolean":
        _check(schema, {"type"})
        return bool
    if kind == "null":
        _check(schema, {"type"})
        return None
    if kind == "array":
        _check(schema, {"type", "items", "maxItems"})
        if "items" not in schema:
            raise _Unsupported("array without items")
        return Annotated[list[_field_type(schema["items"], name)], Meta(max_length=schema.get("maxItems"))]  # type: ignore[misc]
    if kind == "object":
        return _struct(schema, f"{name}_item", None)
    raise _Unsupported(kind)


def _struct(schema: dict[str, Any], name: str, tag: str | None) -> Any:
    """A struct of an object's ``properties``: its ``required`` ones without a default, the others
    ``UNSET`` until given (``to_record`` leaves them out), unknown fields refused."""
    _check(schema, {"type", "properties", "required", "additionalProperties"})
    if schema.get("type") != "object" or schema.get("additionalProperties", True) not in (True, False):
        raise _Unsupported(name)
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    if not required <= set(props):
        raise _Unsupported(sorted(required - set(props)))
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for field, sub in props.items():
        if field == "type" and tag is not None:
            continue  # the tag
        typ = _field_type(sub, f"{name}_{field}")
        fields.append((field, typ) if field in required else (field, Union[typ, UnsetType], UNSET))  # noqa: UP007
    options: dict[str, Any] = {"kw_only": True, "forbid_unknown_fields": True}
    if tag is not None:
        options.update(tag_field="type", tag=tag)
    return msgspec.defstruct(name, fields, **options)


def _typed(event_type: str) -> Any | None:
    schema = load("events", event_type)
    props = schema.get("properties", {})
    if ((props.get("type") or {}).get("const") != event_type or (props.get("v") or {}).get("const") != 1
            or not {"v", "type"} <= set(schema.get("required", ()))):
        return None
    try:
        return _struct(schema, event_type, event_type)
    except (_Unsupported, re.error):
        return None


TYPED: dict[str, Any] = {t: s for t in EVENT_TYPES if (s := _typed(t)) is not None}
"""Event type -> its struct, for the types a struct says exactly."""
DECODER = msgspec.json.Decoder(Union[tuple(TYPED.values())])  # noqa: UP007
"""The one decoder of the structs' union (raises on every message it is not sure of)."""


def to_record(struct: Any) -> dict[str, Any]:
    """The event's map, as the dict decode gives it: every field given (nested objects as maps), none
    left ``UNSET``; the tag ``type`` first."""
    record: dict[str, Any] = msgspec.to_builtins(struct)
    return record


def typed_decode_cost(values: list[bytes], repeat: int = 3) -> dict[str, Any]:
    """us/event of ``parse``, of the typed decode alone and of the typed decode made into maps, over
    the lines of ``values`` the typed decoder takes (the others counted), alternating, best of
    ``repeat`` each."""
    from safepoint.core.events import DEFAULT_CLUSTER, parse
    from safepoint.core.policy import Policy

    max_bytes = Policy().max_message_bytes

    lines = []
    for value in values:
        try:
            DECODER.decode(value)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            continue
        lines.append(value)

    def as_map(value: bytes) -> dict[str, Any]:
        record = to_record(DECODER.decode(value))
        if "cluster" not in record:
            record["cluster"] = DEFAULT_CLUSTER
        return record

    runs: dict[str, Any] = {"parse": lambda v: parse(v, max_bytes), "typed": DECODER.decode, "typed_map": as_map}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            t = time.perf_counter()
            for value in lines:
                run(value)
            best[name] = min(best[name], (time.perf_counter() - t) / max(len(lines), 1) * 1e6)
    return {"events": len(lines), "refused": len(values) - len(lines), "types": sorted(TYPED),
            **{f"{name}_us": us for name, us in best.items()}}
