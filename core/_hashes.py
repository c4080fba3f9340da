"""Input-sized sets held in 8 bytes an item: 64-bit hashes of ids and requests, in arrays."""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable

__all__ = ["HashBag", "RepeatedKeys", "key_hash", "text_hash"]

# Hashes are sorted in this many buckets (by their low byte), so that sorting one takes little memory.
_BUCKETS = 256


class RepeatedKeys:
    """The requests (dedupe keys) that more than one prompt of an input makes, as 64-bit hashes.

    Membership may err only one way: a key made once whose hash meets another's counts as repeated
    (about one chance in 2**64 a pair), which at worst has its prompt planned with the repeated ones.
    """

    __slots__ = ("_hashes",)

    def __init__(self, hashes: Iterable[int] = ()) -> None:
        self._hashes = array("q", sorted(hashes))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str) or not self._hashes:
            return False
        wanted = key_hash(key)
        at = bisect_left(self._hashes, wanted)
        return at < len(self._hashes) and self._hashes[at] == wanted

    def __len__(self) -> int:
        return len(self._hashes)


class HashBag:
    """64-bit hashes, 8 bytes each, and which of them were added more than once."""

    def __init__(self) -> None:
        self._buckets = [array("q") for _ in range(_BUCKETS)]

    def add(self, value: int) -> None:
        self._buckets[value % _BUCKETS].append(value)

    def repeated(self) -> set[int]:
        found: set[int] = set()
        for bucket in self._buckets:
            ordered = sorted(bucket)
            found.update(a for a, b in zip(ordered, ordered[1:]) if a == b)
        return found


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def key_hash(key: str) -> int:
    # A dedupe key is a sha256 in hex already: its first 16 digits are as good a hash as any.
    return int(key[:16], 16) - (1 << 63)
