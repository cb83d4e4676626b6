"""The one JSON encoding of everything safepoint writes (compact, key order as built)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["encode"]


def encode(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
