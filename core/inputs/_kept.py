"""The prompts a check pass keeps, so that storing them reads the input no second time: in memory while few, then in
an anonymous temporary file (``marshal``'d blocks, read back by any number of readers, each at its own offset)."""

from __future__ import annotations

import marshal
import os
import struct
import tempfile
from collections.abc import Iterator
from typing import IO

from ._prompt_spec import PromptSpec

__all__ = ["KeptPrompts"]

# Prompts per block written to the file: one marshal call and one read each way.
BLOCK = 512
_LENGTH = struct.Struct("<I")


def _fields(spec: PromptSpec) -> tuple[object, ...]:
    return (spec.custom_id, spec.position, spec.model, spec.messages, spec.params, spec.metadata, spec.dedupe_key,
            spec.urgency, spec.deadline, spec.endpoint, spec.provider)


class KeptPrompts:
    """Checked prompts in input order: in memory as they are while at most ``in_memory``; past that, when ``spill``,
    all of them in a temporary file (else ``add`` returns False and the caller gives keeping up).

    The file is unlinked from the start (``tempfile.TemporaryFile``): a killed process leaves nothing behind. A
    prompt read back is a new ``PromptSpec`` equal to the one kept. A value ``marshal`` cannot hold (a caller's
    own object in a list input) also makes ``add`` return False."""

    def __init__(self, *, in_memory: int, spill: bool) -> None:
        self._memory: list[PromptSpec] = []
        self._in_memory = in_memory
        self._spill = spill
        self._pending: list[tuple[object, ...]] = []
        self._file: IO[bytes] | None = None
        # Where each written block starts, and the input position of its first prompt.
        self._blocks: list[int] = []
        self._written = 0
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[PromptSpec]:
        return self.iter_from(0)

    def add(self, spec: PromptSpec) -> bool:
        """Keep ``spec`` (the next in input order); False when it cannot be kept (nothing kept is to be used then)."""
        if self.count < self._in_memory:
            self._memory.append(spec)
        elif not self._spill:
            return False
        else:
            if self._memory:
                # A large input: all of it goes to the file, so that memory holds no more than a block.
                self._pending = [_fields(kept) for kept in self._memory]
                self._memory = []
            self._pending.append(_fields(spec))
            if len(self._pending) >= BLOCK and not self._flush():
                return False
        self.count += 1
        return True

    def done(self) -> bool:
        """Every prompt added is written; False if one could not be (nothing kept is to be used then). Readers read
        the file by offset (``os.pread``), so from here on any number of them may, each at its own pace."""
        if not self._flush(last=True):
            return False
        if self._file is not None:
            try:
                self._file.flush()
            except OSError:
                self.close()
                return False
        return True

    def _flush(self, *, last: bool = False) -> bool:
        """Write what is pending, ``BLOCK`` prompts a block; the ``last`` block of the input may hold fewer."""
        pending = self._pending
        whole = len(pending) if last else len(pending) - len(pending) % BLOCK
        self._pending = pending[whole:]
        for start in range(0, whole, BLOCK):
            try:
                data = marshal.dumps(pending[start:start + BLOCK])
                if self._file is None:
                    self._file = tempfile.TemporaryFile(prefix="llm-dispatch-kept-")
                self._file.write(_LENGTH.pack(len(data)) + data)
            except (ValueError, OSError):  # a value marshal cannot hold; no temporary space (disk full, no TMPDIR)
                self.close()
                return False
            self._blocks.append(self._written)
            self._written += _LENGTH.size + len(data)
        return True

    def iter_from(self, start: int) -> Iterator[PromptSpec]:
        """The prompts kept from input position ``start`` on, in order."""
        if start < len(self._memory):
            yield from self._memory[start:]
        if self._file is None:
            return
        fd = self._file.fileno()
        skip = max(start - len(self._memory), 0)
        first, skip = divmod(skip, BLOCK)
        for offset in self._blocks[first:]:
            (size,) = _LENGTH.unpack(os.pread(fd, _LENGTH.size, offset))
            block = marshal.loads(os.pread(fd, size, offset + _LENGTH.size))
            for fields in block[skip:]:
                yield PromptSpec(*fields)
            skip = 0

    def close(self) -> None:
        """Drop the file (reading from it afterwards is an error)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._blocks = []
