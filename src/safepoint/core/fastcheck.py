"""A quick test, compiled from an event's JSON Schema, that a decoded event is valid.

``compile_check(schema)`` turns the part of JSON Schema the contract uses (type, const, enum,
required, properties, additionalProperties true, minimum and maximum, minLength and maxLength,
items and maxItems, and a oneOf between a type and null) into one Python function that returns
True only when the value is certainly valid. It is stricter than the schema in corners no
well-formed event meets (an integer must be a Python int, not a float with no fraction; a string
must be a plain str), and it never says more than the schema: ``parse`` runs the full validator
(fastjsonschema) whenever it answers False, so what is accepted and rejected, and the dead
letter's words, are the validator's. A schema with any other keyword gets no quick test (None).
``tests/unit/test_golden.py`` (every bound of every field of every valid example) and
``test_fuzz.py`` (the fuzz corpus) check that ``parse`` gives what ``parse(..., reference=True)``,
the full validator alone, gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["check_lines", "compile_check"]

_NOTES = frozenset({"$schema", "$id", "title", "description"})
_KEYS = frozenset({"type", "const", "enum", "required", "properties", "additionalProperties", "minimum", "maximum",
                   "minLength", "maxLength", "items", "maxItems", "oneOf"}) | _NOTES


class _Unsupported(Exception):
    pass


class _Gen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"x{self.n}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def value(self, s: Any, v: str, depth: int) -> None:
        """Lines that return False unless ``v`` is certainly valid against ``s``."""
        if not isinstance(s, dict) or not set(s) <= _KEYS:
            raise _Unsupported
        if "oneOf" in s:
            alts = s["oneOf"]
            if set(s) - _NOTES != {"oneOf"} or len(alts) != 2 or {"type": "null"} not in alts:
                raise _Unsupported
            other = alts[0] if alts[1] == {"type": "null"} else alts[1]
            if other.get("type") in (None, "null") or isinstance(other.get("type"), list):
                raise _Unsupported  # the other branch must exclude null, so exactly one branch matches
            self.emit(depth, f"if {v} is not None:")
            self.value(other, v, depth + 1)
            self.emit(depth + 1, "pass")
            return
        if "const" in s:
            c = s["const"]
            if type(c) not in (int, str):
                raise _Unsupported
            self.emit(depth, f"if type({v}) is not {type(c).__name__} or {v} != {c!r}: return False")
        if "enum" in s:
            if not all(type(e) is str for e in s["enum"]):
                raise _Unsupported
            members = ", ".join(repr(e) for e in sorted(set(s["enum"])))  # in order: the same text every run
            self.emit(depth, f"if type({v}) is not str or {v} not in frozenset({{{members}}}): return False")
        t = s.get("type")
        if isinstance(t, list):
            if len(t) != 2 or "null" not in t:
                raise _Unsupported
            other_t = t[0] if t[1] == "null" else t[1]
            self.emit(depth, f"if {v} is not None:")
            self.typed(s, other_t, v, depth + 1)
            self.emit(depth + 1, "pass")
            return
        if t is not None:
            self.typed(s, t, v, depth)
        elif set(s) - _NOTES - {"const", "enum"}:
            raise _Unsupported  # constraints without a type: not in the contract

    def typed(self, s: dict[str, Any], t: str, v: str, depth: int) -> None:
        if t in ("integer", "string"):
            low, high, size = ("minimum", "maximum", v) if t == "integer" else ("minLength", "maxLength", f"len({v})")
            bounds = (f"{int(s[low])} <= " if low in s else "") + size + (f" <= {int(s[high])}" if high in s else "")
            kind = "int" if t == "integer" else "str"
            # one test per field: its type, then its bounds as one chained comparison
            self.emit(depth, f"if type({v}) is not {kind}{f' or not {bounds}' if bounds != size else ''}: return False")
            return
        if t == "boolean":
            self.emit(depth, f"if type({v}) is not bool: return False")
            return
        if t == "null":
            self.emit(depth, f"if {v} is not None: return False")
            return
        if t == "array":
            self.emit(depth, f"if type({v}) is not list: return False")
            if "maxItems" in s:
                self.emit(depth, f"if len({v}) > {int(s['maxItems'])}: return False")
            if "items" in s:
                item = self.var()
                self.emit(depth, f"for {item} in {v}:")
                self.value(s["items"], item, depth + 1)
                self.emit(depth + 1, "pass")
            return
        if t == "object":
            if s.get("additionalProperties", True) is not True:
                raise _Unsupported
            self.emit(depth, f"if type({v}) is not dict: return False")
            required = set(s.get("required", ()))
            for key in sorted(required - set(s.get("properties", {}))):
                self.emit(depth, f"if {key!r} not in {v}: return False")
            # a required property is read as v[key]: a missing one raises KeyError, which the
            # function as a whole answers with False (``compile_check``)
            for key, sub in s.get("properties", {}).items():
                x = self.var()
                if key in required:
                    self.emit(depth, f"{x} = {v}[{key!r}]")
                    self.value(sub, x, depth)
                else:
                    self.emit(depth, f"{x} = {v}.get({key!r}, _MISSING)")
                    self.emit(depth, f"if {x} is not _MISSING:")
                    self.value(sub, x, depth + 1)
                    self.emit(depth + 1, "pass")
            return
        raise _Unsupported


def check_lines(schema: dict[str, Any]) -> list[str] | None:
    """The body of the quick test of ``schema`` (inside a ``try`` of a function of ``x0``, with
    ``_MISSING`` in its scope); None when the schema uses a keyword this compiler does not know.
    ``scripts/gen_event_records.py`` writes them into ``core/quick_checks.py``, which the core's build
    compiles."""
    gen = _Gen()
    try:
        gen.value(schema, "x0", 2)
    except _Unsupported:
        return None
    return gen.lines


def compile_check(schema: dict[str, Any]) -> Callable[[Any], bool] | None:
    """A function that is True only for values certainly valid against ``schema``; None when the
    schema uses a keyword this compiler does not know."""
    lines = check_lines(schema)
    if lines is None:
        return None
    source = ("def check(x0):\n    try:\n" + "\n".join(lines)
              + "\n    except KeyError:  # a required property is missing\n        return False\n    return True\n")
    scope: dict[str, Any] = {"_MISSING": object()}
    exec(compile(source, f"<fastcheck {schema.get('title', '?')}>", "exec"), scope)  # noqa: S102 - our own schema's code
    check: Callable[[Any], bool] = scope["check"]
    return check
