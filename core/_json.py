"""JSON encoders made once, each call going straight to the C encoder.

``json.JSONEncoder.encode`` builds a new C encoder object on every call; these run once or twice per
prompt and per request (request bodies, dedupe keys, stored columns), so each is built here once. The
text is exactly what the ``json.JSONEncoder`` of the same options writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["canonical_json", "compact_json", "make_json_encoder", "stored_json"]


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
