"""Planning a real-time run: what is still to send, answered from storage where it can be, identical
requests grouped, the rest cut into chunks."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Container, Sequence
from dataclasses import dataclass, field


from llm_dispatch import storage
from llm_dispatch.core import ResultSink, RetryFailed, Route, counted

from ._reuse import reuse_stored_answers

logger = logging.getLogger(__name__)

# A Prefect task run costs the flow process about 10 ms of CPU and server round-trips (its states, its tag slot, its
# events): a run keeps to a few dozen...
MAX_CHUNKS_PER_RUN = 25
# ...but a chunk's rows are in memory while it is sent (a few chunks at once): chunks stop growing here,
# so that a job of ten million prompts holds no more than one of a million (more chunks instead).
MAX_GROWN_CHUNK = 5_000


@dataclass(frozen=True, slots=True)
class Selection:
    """Which unfinished prompts of a job a real-time run takes."""

    # Which failed prompts go again: those whose error may pass, all, or none.
    retry_failed: RetryFailed = "retryable"
    # Only prompts routed here; None: any not waiting in a batch.
    planned_route: Route | None = None
    # False leaves prompts marked in flight to the live run sending them (a sweep must not take them over).
    in_flight: bool = True
    # Only this share ``(index, of)`` of them: one shard of a job sent by several runs.
    shard: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class RealtimePlan:
    """Groups of prompt ids (one request each), split into chunks; and what was answered from storage."""

    chunks: list[list[tuple[int, ...]]] = field(default_factory=list)
    unfinished_prompts: int = 0
    reused: int = 0
    # Prompts left out for now because their request is in ``hold_keys``, and those requests.
    held: int = 0
    held_keys: frozenset[str] = frozenset()
    # The last prompt looked at, ``(position, id)``, when a page was asked for and filled: the next
    # page starts after it. None: no prompt is left after this plan's.
    last: tuple[int, int] | None = None
    # Input position of each planned prompt id, when asked for (``plan_realtime(track_positions=True)``).
    positions: dict[int, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


def chunk_size_for(requests: int, *, chunk_size: int, max_chunks: int = MAX_CHUNKS_PER_RUN) -> int:
    """``chunk_size``, grown so that ``requests`` make at most ``max_chunks`` chunks, to at most ``MAX_GROWN_CHUNK``
    (a larger ``chunk_size`` given is kept)."""
    return max(chunk_size, min(math.ceil(requests / max_chunks), MAX_GROWN_CHUNK))


def chunk_groups(groups: Sequence[tuple[int, ...]], *, chunk_size: int, max_chunks: int = MAX_CHUNKS_PER_RUN) -> list[list[tuple[int, ...]]]:
    """Split request groups into chunks of ``chunk_size`` requests, growing the size to stay under ``max_chunks``."""
    if not groups:
        return []
    size = chunk_size_for(len(groups), chunk_size=chunk_size, max_chunks=max_chunks)
    return [list(groups[start : start + size]) for start in range(0, len(groups), size)]


async def plan_realtime(
    *,
    job_id: str,
    sessions: storage.Sessions,
    sink: ResultSink,
    chunk_size: int,
    dedupe: bool,
    selection: Selection = Selection(),
    positions: tuple[int, int] | None = None,
    page: tuple[tuple[int, int] | None, int] | None = None,
    hold_keys: Container[str] = frozenset(),
    only_keys: Collection[str] | None = None,
    track_positions: bool = False,
) -> RealtimePlan:
    """Find the job's unfinished prompts that ``selection`` takes; answer what storage already has;
    group and chunk the rest.

    For a job sent while it is being recorded (see ``store_rest``), one slice at a time:
    ``positions=(start, stop)`` plans only the prompts at those input positions, leaving out (when
    grouping identical requests) those making a request in ``hold_keys``, whose other prompts may
    not be stored yet; ``only_keys`` plans just the prompts making those requests.
    ``page=(after, limit)``: only the first ``limit`` prompts after ``after`` (a ``RealtimePlan.last``,
    or None to start), so that a job of any size is planned a keyset page at a time.
    ``track_positions`` fills ``RealtimePlan.positions``, for a caller holding the prompts in memory.
    """
    after, limit = page if page is not None else (None, None)
    found = await storage.unfinished_prompts(
        sessions, job_id=job_id, retry_failed=selection.retry_failed, planned_route=selection.planned_route,
        in_flight=selection.in_flight, shard=selection.shard, positions=positions, dedupe_keys=only_keys,
        after=after, limit=limit)
    if not found:
        return RealtimePlan()
    last = (found[-1].position, found[-1].id) if limit is not None and len(found) == limit else None
    if not dedupe:
        return RealtimePlan(chunks=chunk_groups([(prompt.id,) for prompt in found], chunk_size=chunk_size),
                            unfinished_prompts=len(found), positions=_positions(found) if track_positions else {},
                            last=last)

    by_key: dict[str, list[int]] = {}
    held_keys: set[str] = set()
    held = 0
    for prompt in found:  # in input order, so a group's first id is its earliest prompt
        if prompt.dedupe_key in hold_keys:
            held += 1
            held_keys.add(prompt.dedupe_key)
            continue
        by_key.setdefault(prompt.dedupe_key, []).append(prompt.id)
    if not by_key:
        return RealtimePlan(held=held, held_keys=frozenset(held_keys), last=last)

    answered = await reuse_stored_answers(sessions=sessions, sink=sink, groups=by_key)
    reused = sum(len(by_key.pop(key)) for key in answered)
    if reused:
        logger.info("%s answered from stored identical requests (no new cost); --no-dedupe turns this off",
                    counted(reused, "prompt"))
    groups = [tuple(ids) for ids in by_key.values()]
    return RealtimePlan(chunks=chunk_groups(groups, chunk_size=chunk_size), unfinished_prompts=len(found) - held,
                        reused=reused, held=held, held_keys=frozenset(held_keys), last=last,
                        positions=_positions(found) if track_positions else {})


def _positions(found: Sequence[storage.UnfinishedPrompt]) -> dict[int, int]:
    return {prompt.id: prompt.position for prompt in found}
