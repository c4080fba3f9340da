"""An embedding's vector as it is stored: float32 little-endian bytes, 4 a dimension (no HTTP stack: exports read it)."""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from typing import Any

__all__ = ["vector_bytes", "vector_floats"]


def vector_bytes(values: Any) -> bytes | None:
    """A vector as float32 little-endian bytes: from the API's base64 text, or from a list of floats."""
    if isinstance(values, str):
        try:
            raw = base64.b64decode(values, validate=True)
        except (binascii.Error, ValueError):
            return None
        return raw if raw and len(raw) % 4 == 0 else None
    if not isinstance(values, list) or not values:
        return None
    try:
        floats = array("f", values)
    except TypeError:
        return None
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tobytes()


def vector_floats(raw: bytes) -> list[float]:
    """The floats of stored vector bytes."""
    floats = array("f")
    floats.frombytes(raw)
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tolist()
