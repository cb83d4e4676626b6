"""``JsonFloat``: how the core's JSON decoders keep a number with a fraction or exponent.

A module of its own because it subclasses ``str``: the compiled core (``scripts/build_core.py``)
cannot compile a subclass of a builtin, so this one stays plain Python.
"""

__all__ = ["JsonFloat"]


class JsonFloat(str):
    """A JSON number with a fraction or exponent; never valid where the contract wants an int."""

    __slots__ = ()
