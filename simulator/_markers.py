"""``[[sim:FAULT]]`` and ``[[sim:FAULTxN]]`` markers in a prompt's messages: the faults a test asks for in the text."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any, TypeVar

__all__ = ["MARKER", "MARKER_BYTES", "marker_fault", "marker_pattern"]

MARKER = re.compile(r"\[\[sim:([^\]\s]*)\]\]")
# A body without these bytes has no marker: most bodies skip the message walk.
MARKER_BYTES = b"[[sim:"

_Refusal = TypeVar("_Refusal")


def marker_pattern(faults: Collection[str]) -> re.Pattern[str]:
    """What may stand inside a marker: one of ``faults``, then ``xN`` optionally."""
    return re.compile(rf"({'|'.join(sorted(faults))})(?:x([1-9][0-9]*))?")


def marker_fault(
    messages: Any,
    *,
    digest: bytes,
    hits: dict[bytes, int],
    pattern: re.Pattern[str],
    allowed: Collection[str],
    where: str,
    refuse: Callable[[str], _Refusal],
    seen: dict[str, int] | None = None,
) -> str | _Refusal | None:
    """The fault a ``[[sim:FAULT]]`` / ``[[sim:FAULTxN]]`` marker asks of this body, if any.

    ``FAULTxN`` faults the first N bodies with this ``digest`` (counted in ``hits``); an unknown
    marker gets ``refuse(message)``, a 400 in the caller's API that explains the format. ``seen`` counts
    the bodies that carried each FAULT, those past their N included: how often a prompt was sent. Shared by
    chat, Messages and both APIs' batch lines.
    """
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        for text in _text_parts(message.get("content")):
            found = MARKER.search(text)
            if found is None:
                continue
            parsed = pattern.fullmatch(found.group(1))
            if parsed is None:
                return refuse(
                    f"Unknown simulator marker {found.group(0)!r}; {where}write [[sim:FAULT]] or [[sim:FAULTxN]] "
                    f"with FAULT one of {', '.join(sorted(allowed))}.")
            fault, times = parsed.group(1), parsed.group(2)
            if seen is not None:
                seen[fault] = seen.get(fault, 0) + 1
            if times is None:
                return fault
            count = hits.get(digest, 0) + 1
            hits[digest] = count
            return fault if count <= int(times) else None
    return None


def _text_parts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []
