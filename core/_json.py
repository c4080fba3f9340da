"""JSON: encoders made once, each call going straight to the C encoder; one reader of JSON text in bulk (``read_json``);
and the one way a typed result (a summary, a report) becomes JSON values (``to_json``).

``json.JSONEncoder.encode`` builds a new C encoder object on every call; these run once or twice per
prompt and per request (request bodies, dedupe keys, stored columns), so each is built here once. The
text is exactly what the ``json.JSONEncoder`` of the same options writes.
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
import operator
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from enum import Enum
from typing import Any

import orjson

__all__ = ["JsonAs", "canonical_json", "compact_json", "dollars", "json_field", "json_texts", "make_json_encoder",
           "money", "read_json", "stored_json", "to_json"]

# Each byte as "0" (an ASCII digit) or "1": a run of 19 digits, which orjson may read otherwise (an integer beyond 64
# bits becomes a float there), is then a plain substring search.
_DIGITS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x31 for byte in range(256))
_LONG_DIGITS = b"0" * 19


def read_json(text: str | bytes | bytearray) -> Any:
    """What ``json.loads(text)`` returns, and raises, read by orjson where the two agree (most text, several times
    faster): text orjson refuses (NaN, a lone surrogate, a BOM, UTF-16) or may read differently (a run of 19 digits or
    more: a large integer) is read by ``json.loads``."""
    data = text
    if isinstance(text, str):
        try:
            data = text.encode()
        except UnicodeEncodeError:  # a lone surrogate
            return json.loads(text)
    if _LONG_DIGITS not in data.translate(_DIGITS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def make_json_encoder(
    *, separators: tuple[str, str], sort_keys: bool = False, allow_nan: bool = True
) -> Callable[[Any], str]:
    """What ``json.JSONEncoder(ensure_ascii=False, separators=..., sort_keys=..., allow_nan=...).encode``
    returns, without circular-reference checks (a prompt or a body read from JSON has no cycles)."""
    python = json.JSONEncoder(ensure_ascii=False, separators=separators, sort_keys=sort_keys, allow_nan=allow_nan)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another Python): the plain encoder
        return python.encode
    item_separator, key_separator = separators
    encoder = make(None, python.default, json.encoder.encode_basestring, None, key_separator, item_separator,
                   sort_keys, False, allow_nan)

    def encode(value: Any) -> str:
        return "".join(encoder(value, 0))

    return encode


# Request bodies and batch lines: compact, and no NaN (no provider accepts it).
compact_json = make_json_encoder(separators=(",", ":"), allow_nan=False)
# Dedupe keys: the same object always gives the same text.
canonical_json = make_json_encoder(separators=(",", ":"), sort_keys=True)
# JSON columns, as stored since the first release.
stored_json = make_json_encoder(separators=(", ", ": "))

# json.loads' own scanner (the C one where there is one), called on a text without json.loads' three Python calls
# around it: ``_scan(text, 0)`` is ``(value, where it ended)``.
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: any context with its attributes
_NONE = (None, 0)
_value, _end = operator.itemgetter(0), operator.itemgetter(1)


def json_texts(texts: Sequence[str | None]) -> list[Any]:
    """``json.loads`` of each text (None stays None), a column of stored JSON at a time. A text the scanner does not
    read whole from its first character (whitespace around it, or not JSON) takes the page through ``json.loads``,
    which reads it or raises as it always has."""
    try:
        read = [_NONE if text is None else _scan(text, 0) for text in texts]
    except (StopIteration, ValueError):  # not a JSON value at its first character, or not one at all
        read = None
    # Each end is at most its text's length: the sums are equal only when every text was read to its end (an empty
    # text, which ``filter`` leaves out, stopped the scanner above).
    if read is None or sum(map(_end, read)) != sum(map(len, filter(None, texts))):
        return [None if text is None else json.loads(text) for text in texts]
    return list(map(_value, read))


def money(value: Decimal) -> float:
    """Dollars for JSON and tables, to a millionth (a small job's whole cost is a fraction of a cent)."""
    return float(value.quantize(Decimal("0.000001")))


def dollars(value: Decimal, *, unpriced: int | bool = False) -> str:
    """A cost as a report shows it: "$0.001234"; when some of what it counts has no price (``unpriced``), "unknown"
    if nothing of it is priced, else "$0.001234 + unknown": an unknown price is never shown as $0."""
    if not unpriced:
        return f"${money(value):.6f}"
    return "unknown" if not value else f"${money(value):.6f} + unknown"


@dataclasses.dataclass(frozen=True, slots=True)
class JsonAs:
    """How ``to_json`` writes one field of a dataclass (its ``metadata["json"]``; see ``json_field``)."""

    # The key, when not the field's name.
    name: str | None = None
    # Left out (a value the JSON shows otherwise, through a property).
    skip: bool = False
    # A nested result whose keys stand at this level.
    inline: bool = False
    # Seconds and the like: a float (or each float of a dict) rounded to this many digits.
    digits: int | None = None
    # Left out when None.
    omit_none: bool = False


def json_field(**how: Any) -> Any:
    """A dataclass field written as ``JsonAs(**json)`` says; ``default``/``default_factory`` as ``dataclasses.field``."""
    options = {key: how.pop(key) for key in ("default", "default_factory") if key in how}
    return dataclasses.field(metadata={"json": JsonAs(**how)}, **options)


_PLAIN = JsonAs()


def to_json(value: Any) -> Any:
    """``value`` as JSON values: a dataclass as an object of its fields (as each field's ``JsonAs`` says) followed
    by the properties its class names in ``json_properties``; dollars (``Decimal``) by ``money``; enums by value;
    mappings, lists and tuples item by item. The one way a typed result becomes JSON (``--json``, artifacts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for spec in dataclasses.fields(value):
            how: JsonAs = spec.metadata.get("json", _PLAIN)
            if how.skip:
                continue
            item = getattr(value, spec.name)
            if how.omit_none and item is None:
                continue
            if how.inline:
                out.update(to_json(item))
                continue
            out[how.name or spec.name] = _rounded(to_json(item), how.digits) if how.digits is not None else to_json(item)
        for name in getattr(type(value), "json_properties", ()):
            out[name] = to_json(getattr(value, name))
        return out
    if isinstance(value, Decimal):
        return money(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    return value


def _rounded(value: Any, digits: int) -> Any:
    if isinstance(value, dict):
        return {key: _rounded(item, digits) for key, item in value.items()}
    return round(value, digits) if isinstance(value, float) else value
