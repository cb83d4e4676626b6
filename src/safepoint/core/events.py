"""Parsing and validation of input events against the contract's JSON Schemas.

``parse`` turns one message value into a validated event dict or a ``Rejected`` with a
precise reason for the dead-letter topic. It never raises on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Final, cast

import fastjsonschema
import msgspec

from safepoint.core.event_records import ControlEvent, Event, NodeEvent
from safepoint.core.event_structs import DECODER, TYPE_OF, HoldEvent
from safepoint.core.fastcheck import compile_check
from safepoint.core.holds import EVENTS as HOLD_EVENTS
from safepoint.core.jsonfloat import JsonFloat as _JsonFloat
from safepoint.core.quick_checks import QUICK
from safepoint.schemas import CONTROL_EVENT_TYPES, EVENT_TYPES, NODE_EVENT_TYPES, load

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's own from Python 3.13

__all__ = ["Rejected", "parse", "parse_obj", "typed_event", "is_control_event", "is_node_event", "DEFAULT_CLUSTER", "DEADLETTER_CODES"]

DEFAULT_CLUSTER = "default"
_NODE_TYPES = frozenset(NODE_EVENT_TYPES)
_CONTROL = frozenset(CONTROL_EVENT_TYPES)
_KNOWN = frozenset(EVENT_TYPES)
_PREFIX_CODES = (
    ("empty message", "empty"),
    ("oversized message", "oversized"),
    ("not UTF-8", "not_utf8"),
    ("not JSON", "not_json"),
    ("not an object", "not_object"),
    ("missing field", "missing_field"),
    ("mistyped field", "mistyped_field"),
    ("unsupported v", "unsupported_v"),
    ("unknown type", "unknown_type"),
)
DEADLETTER_CODES = (
    "empty",
    "oversized",
    "not_utf8",
    "not_json",
    "not_object",
    "missing_field",
    "mistyped_field",
    "out_of_range",
    "unsupported_v",
    "unknown_type",
    "invalid_field",
)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that cannot be applied, and why (the dead letter's ``error``)."""

    error: str

    @property
    def code(self) -> str:
        """The class of the error, for counters: one of DEADLETTER_CODES."""
        e = self.error
        for prefix, code in _PREFIX_CODES:
            if e.startswith(prefix):
                return code
        if e.startswith("invalid "):
            inner = e.split(": ", 1)[-1]
            for prefix, code in (("missing", "missing_field"), ("mistyped", "mistyped_field"), ("out of range", "out_of_range")):
                if inner.startswith(prefix):
                    return code
            return "invalid_field"
        return "invalid_field"


def _bad_constant(name: str) -> Any:
    msg = f"not JSON: {name} is not a JSON number"
    raise ValueError(msg)


_DECODER = json.JSONDecoder(parse_float=_JsonFloat, parse_constant=_bad_constant)
"""One decoder for every message (``json.loads`` with hooks builds a new one per call)."""
_FAST = msgspec.json.Decoder(float_hook=_JsonFloat)
"""msgspec's JSON decoder, about three times faster than ``json``'s. It accepts no text that
``json`` rejects and gives the same value for what both accept (numbers with a fraction or
exponent as ``_JsonFloat`` too: ``tests/unit/test_golden.py`` and ``test_fuzz.py`` compare
``parse`` with ``parse(..., reference=True)`` on the schema vectors, the fuzz corpus and generated
text); where it fails, ``json``'s decoder gives the verdict, so a dead letter's words are
``json``'s."""


_LONE_SURROGATE = "not UTF-8: a string escapes a lone UTF-16 surrogate (\\ud800-\\udfff)"
"""Why a message is refused whose JSON escapes a surrogate that no UTF-8 output can carry."""


def decode(text: str) -> Any:
    """The JSON value of ``text`` (raises as ``json`` does on what is not JSON)."""
    try:
        return _FAST.decode(text)
    except Exception:  # noqa: BLE001 - msgspec could not: json decides, with its own error
        return _DECODER.decode(text)


@cache
def _validator(event_type: str) -> Callable[[Any], Any]:
    validate: Callable[[Any], Any] = fastjsonschema.compile(load("events", event_type))
    return validate


_SURE: dict[str, Callable[[Any], bool]] = {}
"""Event type -> its quick test, for the types whose schema requires ``v`` 1 and the type itself
(``_quick`` fills it): a value that passes is a valid event, with nothing left for ``parse_obj``'s
own checks to say."""


@cache
def _quick(event_type: str) -> Callable[[Any], bool] | None:
    schema = load("events", event_type)
    check = QUICK.get(event_type) or compile_check(schema)  # the compiled core's, or written now
    props = schema.get("properties", {})
    version, kind = (props.get("v") or {}).get("const"), (props.get("type") or {}).get("const")
    if (check is not None and {"v", "type"} <= set(schema.get("required", ()))
            and type(version) is int and version == 1 and kind == event_type):
        _SURE[event_type] = check
    return check


def is_node_event(event: Event) -> TypeIs[NodeEvent]:
    """A node's event (its node's rules take it); a registered hold kind's events are (``core/holds.py``)."""
    kind = event["type"]
    return kind in _NODE_TYPES or kind in HOLD_EVENTS


def is_control_event(event: Event) -> TypeIs[ControlEvent]:
    """An operator's control event (the control topic's: ``CONTROL_EVENT_TYPES``): the core's one test
    of it (routing, refusal, signatures and the control part all ask it)."""
    return event["type"] in _CONTROL


def typed_event(value: bytes | str | None, max_bytes: int) -> HoldEvent | None:
    """A hold's opening or closing decoded and validated as a struct (``core/event_structs.py``), or
    None: another event, or one the struct's decoder is not sure of, or a message ``parse``'s own
    checks must see (text, oversized, or with a ``\\u`` escape, which may hide a lone surrogate):
    ``parse`` decides it. Whatever this decodes, ``parse`` accepts with the same fields."""
    if value is None or isinstance(value, str) or len(value) > max_bytes or _escapes(value):
        return None
    try:
        decoded: object = DECODER.decode(value)
    except Exception:  # noqa: BLE001 - not sure: parse gives the verdict
        return None
    return cast("HoldEvent", decoded) if type(decoded) in TYPE_OF else None


def parse(value: bytes | str | None, max_bytes: int, *, reference: bool = False) -> Event | Rejected:
    """Decode, parse and validate one message value. ``reference``: with ``json``'s decoder and
    the full validator on every message, as before msgspec and the quick test (the tests compare
    the two)."""
    if value is None:
        return Rejected("empty message: the value is null")
    if not reference and not isinstance(value, str) and len(value) <= max_bytes:
        try:  # msgspec reads the bytes as they are, refusing what is not UTF-8
            obj = _FAST.decode(value)
        except Exception:  # noqa: BLE001, S110 - the long way below gives the verdict in its words
            pass
        else:
            if _escapes(value) and _has_lone_surrogate(obj):
                return Rejected(_LONE_SURROGATE)
            return parse_obj(obj)
    if isinstance(value, str):
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            return Rejected(f"not UTF-8: {exc.reason} at character {exc.start}")
        text = value
    else:
        size = len(value)
        if size > max_bytes:
            return Rejected(f"oversized message: {size} bytes > max_message_bytes {max_bytes}")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected(f"not UTF-8: {exc.reason} at byte {exc.start}")
    if size > max_bytes:
        return Rejected(f"oversized message: {size} bytes > max_message_bytes {max_bytes}")
    try:
        obj = _DECODER.decode(text) if reference else decode(text)
    except ValueError as exc:
        reason = str(exc)
        if not reason.startswith("not JSON"):
            reason = f"not JSON: {reason}"
        return Rejected(reason)
    except RecursionError:
        return Rejected("not JSON: nested too deeply")
    if "\\u" in text and _has_lone_surrogate(obj):
        return Rejected(_LONE_SURROGATE)
    return parse_obj(obj, reference=reference)


def _escapes(value: bytes) -> bool:
    """Whether a message's bytes hold a ``\\u`` escape, which may hide a lone surrogate. A search for
    the backslash alone first, as a byte's value: ``int in bytes`` is a bare ``memchr``, where a
    search for bytes parses its arguments first (about 600 instructions) and two bytes take
    CPython's general search; most events hold no backslash at all."""
    return _BACKSLASH in value and value.find(b"\\u") >= 0


_BACKSLASH: Final = 0x5C


def _has_lone_surrogate(obj: Any) -> bool:
    """JSON may escape a lone surrogate (\\ud800) that no UTF-8 output can carry."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _type_name(obj: Any) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, _JsonFloat):
        return "number with a fraction"
    return {int: "integer", str: "string", list: "array", dict: "object"}.get(type(obj), type(obj).__name__)


def parse_obj(obj: Any, *, reference: bool = False) -> Event | Rejected:
    """Validate an already decoded JSON value (``reference``: the full validator, without the
    quick test first): the typed record its schema says it is (``core/event_records.py``)."""
    if not reference and type(obj) is dict:  # the commonest value: a valid event of a type met before
        t = obj.get("type")
        sure = _SURE.get(t) if type(t) is str else None
        if sure is not None and sure(obj):
            if "cluster" not in obj:
                obj["cluster"] = DEFAULT_CLUSTER
            return cast(Event, obj)
    if not isinstance(obj, dict):
        return Rejected(f"not an object: the value is a JSON {_type_name(obj)}")
    if "v" not in obj:
        return Rejected("missing field v (contract version)")
    v = obj["v"]
    if not isinstance(v, int) or isinstance(v, bool):
        return Rejected(f"mistyped field v: expected integer, got {_type_name(v)}")
    if v != 1:
        return Rejected(f"unsupported v {v}: this job reads contract version 1")
    if "type" not in obj:
        return Rejected("missing field type")
    event_type = obj["type"]
    if not isinstance(event_type, str):
        return Rejected(f"mistyped field type: expected string, got {_type_name(event_type)}")
    if event_type not in _KNOWN:
        shown = event_type if len(event_type) <= 64 else event_type[:64] + "..."
        return Rejected(f"unknown type {shown!r}")
    quick = None if reference else _quick(event_type)
    if quick is None or not quick(obj):  # not certainly valid: the validator decides, in its words
        try:
            _validator(event_type)(obj)
        except fastjsonschema.JsonSchemaValueException as exc:
            return Rejected(f"invalid {event_type}: {_explain(exc)}")
    if "cluster" not in obj:
        obj["cluster"] = DEFAULT_CLUSTER
    return cast(Event, obj)


def _explain(exc: fastjsonschema.JsonSchemaValueException) -> str:
    """Turn fastjsonschema's message into the contract's vocabulary."""
    message = exc.message.replace("data.", "field ").replace("data[", "field [")
    if message.startswith("data must contain"):
        missing = message.removeprefix("data must contain ").removesuffix(" properties")
        return f"missing field(s) {missing}"
    rule = exc.rule
    if rule == "type":
        return f"mistyped {message}"
    if rule in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"out of range: {message}"
    return message
