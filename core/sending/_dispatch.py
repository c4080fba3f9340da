"""Sends a set of chat requests concurrently and hands each outcome to a sink the moment it arrives.

Plain asyncio over one shared client; it knows nothing of Prefect or SQL. A ``WorkItem`` may stand
for several prompts that make the identical request: it is sent once and answers them all. Embeddings items that
differ only in their text are packed into one request (``_packing``), each still answered on its own.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from ..caching._plan import CachePlan
from ..caching._warmup import WarmUpQueue
from ..pricing._budgets import SpendGate
from .._exceptions import APIError, APIStatusError
from ..wire._openai_responses import runs_in_background
from ..wire._packing import (
    EMBEDDING_PACK_LIMITS, PackLimits, PackLimitsFor, Packer, embedding_text, pack_key, unpack_embeddings,
)
from .._status import ResultRoute
from ..http._stops import RunStop
from ..wire._structured import answer_schema, answer_text, checked, reask_messages
from .._types import ChatRequest, ChatResult

__all__ = [
    "ChatSender",
    "DispatchOutcome",
    "Progress",
    "ResultSink",
    "WorkItem",
    "current_progress",
    "reask",
    "send_all",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request to send, and the prompt rows its answer belongs to."""

    prompt_ids: tuple[int, ...]
    request: ChatRequest
    # A packed embeddings request's items, one a text, in input order (``prompt_ids`` is all theirs); else empty.
    parts: tuple[WorkItem, ...] = ()


def pack_work(items: Sequence[WorkItem], *, limits: PackLimits | PackLimitsFor = EMBEDDING_PACK_LIMITS
              ) -> list[WorkItem]:
    """``items`` with the embeddings ones that may share a request packed (``_packing.Packer``), in order of their
    first item; a pack of one is its item as it was. ``limits``: one for all, or each request's."""
    packer: Packer[WorkItem] = Packer(limits=limits)
    # A place per item that is not packed, and per pack once it is closed; None holds an open pack's place.
    slots: list[WorkItem | None] = []
    where: dict[str, int] = {}  # the place of each key's open pack

    def place(key: str, members: list[WorkItem], request: ChatRequest) -> None:
        slots[where.pop(key)] = members[0] if len(members) == 1 else WorkItem(
            prompt_ids=tuple(pid for member in members for pid in member.prompt_ids), request=request,
            parts=tuple(members))

    for item in items:
        key = pack_key(item.request) if item.request.background_id is None else None
        if key is None:
            slots.append(item)
            continue
        closed = packer.add(key, item, item.request)
        if closed is not None:
            place(key, closed.members, closed.request())
        if key not in where:
            where[key] = len(slots)
            slots.append(None)
    for pack in packer.close():
        place(pack.key, pack.members, pack.request())
    return [slot for slot in slots if slot is not None]


class ChatSender(Protocol):
    # ``creating`` and ``started`` are given only for a request in background mode (``runs_in_background``): awaited
    # before its create is sent, and told its response id.
    async def chat(self, request: ChatRequest) -> ChatResult: ...


def _limits_for(client: Any, packing: PackLimits) -> PackLimits | PackLimitsFor:
    """``packing`` within each request's provider's own limits, when the sender knows them (``LLMClient`` and a run's
    ``Clients`` have ``pack_limits``: Gemini takes 100 texts a request, OpenAI 2,048); else ``packing`` alone."""
    own: PackLimitsFor | None = getattr(client, "pack_limits", None)
    if own is None:
        return packing
    return lambda request: packing.within(own(request))


def _keeps_background(sink: Any) -> bool:
    """Whether the sink keeps background creates (``background_creating``) and ids (``background_started``)."""
    return getattr(sink, "background_creating", None) is not None and getattr(sink, "background_started", None) is not None


def _background_hooks(sink: Any, item: WorkItem) -> dict[str, Callable[..., Awaitable[None]]]:
    """For a request in background mode (``runs_in_background``) to a sink that keeps its creates and ids
    (``_keeps_background``): what counts each create for the item's prompts before it is sent, and what stores its
    id as soon as it is created."""
    count, keep = sink.background_creating, sink.background_started

    async def creating() -> None:
        await count(prompt_ids=item.prompt_ids)

    async def started(background_id: str) -> None:
        await keep(prompt_ids=item.prompt_ids, background_id=background_id)

    return {"creating": creating, "started": started}


class ResultSink(Protocol):
    # ``model`` is the one requested (the price table's name for it); the answer's own may be a dated snapshot.
    # ``reask``: which asking of the prompts ``result`` answers (0: their own request; n: the n-th re-ask).
    async def success(
        self, *, prompt_ids: Sequence[int], result: ChatResult, route: ResultRoute = "realtime",
        model: str | None = None,
        reask: int = 0,
    ) -> None: ...

    async def failure(
        self, *, prompt_ids: Sequence[int], error: BaseException, final: bool = True, model: str | None = None,
        reask: int = 0,
    ) -> None: ...

    # Prompts marked in flight and then not sent (a ``RunStop`` stopped their provider or model): pending again.
    async def release(self, *, prompt_ids: Sequence[int]) -> int: ...


@dataclass(slots=True)
class Progress:
    """Live counters for a display; requests, not prompts."""

    total: int = 0
    succeeded: int = 0
    failed: int = 0
    in_flight: int = 0
    started_at: float = field(default_factory=time.monotonic)
    # Lines for the person watching (the cost estimate, say), shown once each above the bar.
    notes: list[str] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started_at
        return self.done / elapsed if elapsed > 0 else 0.0


# An observer, not configuration: the CLI sets it to draw a progress bar; flows run without it.
current_progress: ContextVar[Progress | None] = ContextVar("llm_dispatch_progress", default=None)


@dataclass(slots=True)
class DispatchOutcome:
    """What one ``send_all`` call did, counted in prompts."""

    succeeded: int = 0
    failed: int = 0
    failed_by_class: Counter[str] = field(default_factory=Counter)
    # Answered with a refusal (counted apart from ``succeeded``).
    refused: int = 0
    # Answered, but not as the request's schema asks (``ChatResult.violation``), after any re-asks.
    invalid: int = 0
    # Of the others, answered as their schema asks only when asked again; and the re-asks sent (requests).
    valid_after_reask: int = 0
    reasks: int = 0
    # Not sent: their provider or model was stopped (``RunStop``); left pending.
    left: int = 0
    # Not sent: their worst case did not fit the run's budget (``SpendGate``); left pending.
    over_budget: int = 0

    def add(self, other: DispatchOutcome) -> None:
        """Count ``other``'s prompts in too: every field is a count (``failed_by_class``, one a class)."""
        for counted in fields(self):
            mine = getattr(self, counted.name)
            if isinstance(mine, Counter):
                mine.update(getattr(other, counted.name))
            else:
                setattr(self, counted.name, mine + getattr(other, counted.name))


async def reask(
    *,
    client: ChatSender,
    item: WorkItem,
    result: ChatResult,
    schema: dict[str, Any],
    sink: ResultSink,
    max_reasks: int,
    outcome: DispatchOutcome,
    first: int = 1,
    budget: SpendGate | None = None,
) -> ChatResult:
    """Ask ``item`` again while its answer breaks ``schema``, up to ``max_reasks`` times: its conversation, the
    invalid answer and a message naming the violation. Each answer is stored as its own result (``reask`` n, its own
    cost); returns the last. ``first``: the number of the first re-ask (an answer asked again before, as a batch's,
    goes on from there). A re-ask whose call fails is stored as a failed result of its own (``reask`` n, what it
    cost) and leaves the prompts with their invalid answer; one whose worst case does not fit ``budget`` is not
    sent, and leaves them so too."""
    for number in range(first, max_reasks + 1):
        if result.violation is None:
            break
        again = ChatRequest(model=item.request.model, params=item.request.params, endpoint=item.request.endpoint,
                            lane=item.request.lane,
                            messages=reask_messages(item.request.messages, answer=answer_text(result),
                                                    violation=result.violation))
        amount = None if budget is None else await budget.reserve(again)
        if budget is not None and amount is None:
            break
        outcome.reasks += 1
        try:
            try:
                answer = await client.chat(again)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the invalid answer stays the prompts' outcome
                logger.warning("asking prompt ids %s again failed (%s); they keep their invalid answer",
                               item.prompt_ids[:3], exc)
                await sink.failure(prompt_ids=item.prompt_ids, error=exc, model=item.request.model, reask=number)
                break
            result = checked(answer, schema)
            await sink.success(prompt_ids=item.prompt_ids, result=result, route=again.lane or "realtime",
                               model=item.request.model, reask=number)
        finally:
            if budget is not None and amount is not None:
                budget.landed(amount)
        if result.violation is None:
            outcome.valid_after_reask += len(item.prompt_ids)
    return result


async def send_all(
    *,
    client: ChatSender,
    items: Iterable[WorkItem],
    sink: ResultSink,
    concurrency: int,
    progress: Progress | None = None,
    on_dispatched: Callable[[], None] | None = None,
    stop: RunStop | None = None,
    max_reasks: int = 0,
    budget: SpendGate | None = None,
    packing: PackLimits | None = EMBEDDING_PACK_LIMITS,
    cache_plan: CachePlan | None = None,
) -> DispatchOutcome:
    """Send every item with at most ``concurrency`` requests in flight; persist each as it completes.

    Embeddings items that differ only in their text go out packed, within ``packing`` (None: one text a request) and
    within their provider's limits when ``client`` names them (``pack_limits``):
    the packed request is reserved, sent, retried and counted as one; each text's prompts get their own result (its
    vector, its share of the usage). A pack the provider refuses with a 400 or 413 (not billed) is sent again as two
    halves, down to single texts, so one bad text fails alone.

    An answer that breaks its request's schema is asked again at once, up to ``max_reasks`` times (``reask``).

    Provider errors are recorded as failures and do not stop the others, unless ``stop`` (the run's) stops
    their provider or model (a refused key, an account out of credit, an unknown model): its items are then
    not sent, and their prompts are released to pending. An error of the sink (the database) does stop
    everything, since results could no longer be kept. ``budget`` (the run's) holds each request's worst case before it
    is sent; once one does not fit, no more are sent: the rest are released to pending too, and the requests out
    finish.
    ``on_dispatched`` is called once, when at most two rounds (2 x ``concurrency`` items) are left
    to finish: at full speed, two latency periods before this call runs dry, time for a caller to
    start the next batch of work so the limit never idles between batches. It is counted in answers
    (or failures), never in items taken: a worker holding an item may still be waiting for a slot of
    the client's limit behind another call's requests, and signalling then would have the caller
    start batch after batch, each waiting with all its items, until the whole job is in memory.
    A call of at most two rounds signals at its first answer, once its requests are getting slots.

    ``cache_plan`` (``core.caching``): each request is sent as the plan makes it (a prompt_cache_key, a
    breakpoint), and a warm-up key's first request is answered before the rest of that key's requests leave
    (``WarmUpQueue``), the workers sending other requests meanwhile. A group given an explicit cache (Gemini's) has
    it made before its first request goes, by that request's worker; its making is the group's warm-up.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    outcome = DispatchOutcome()
    work = list(items) if packing is None else pack_work(list(items), limits=_limits_for(client, packing))
    low_water = max(1, len(work) - 2 * concurrency)
    queue: WarmUpQueue[WorkItem] | None = None
    answered: set[int] = set()  # ids of the items answered, for the warm-ups
    group_keys: dict[int, str] = {}  # the cache plan's group of each item that has one
    if cache_plan is not None:
        warm_keys: dict[int, str | None] = {}
        planned: list[WorkItem] = []
        for item in work:
            request, warm_key = cache_plan.prepare(item.request)
            ready = item if request is item.request else WorkItem(prompt_ids=item.prompt_ids, request=request,
                                                                  parts=item.parts)
            warm_keys[id(ready)] = warm_key
            group_key = cache_plan.group_key(item.request)
            if group_key is not None:
                group_keys[id(ready)] = group_key
            planned.append(ready)
        work = planned
        queue = WarmUpQueue(work, key=lambda item: warm_keys.get(id(item)), warmth=cache_plan.warmth)
    pending = iter(work)
    finished = 0
    signalled = False

    def dispatched() -> None:
        nonlocal signalled
        if not signalled and on_dispatched is not None:
            signalled = True
            on_dispatched()

    left: list[WorkItem] = []
    unfunded: list[WorkItem] = []
    # Looked up once, not per request: whether any request may need the background hooks.
    background = _keeps_background(sink)

    async def send(item: WorkItem) -> None:
        if budget is not None:
            amount = await budget.reserve(item.request)
            if amount is None:
                unfunded.append(item)
                return
            try:
                await paid(item)
            finally:
                budget.landed(amount)  # after the sink has its cost
            return
        await paid(item)

    async def paid(item: WorkItem) -> None:
        model = item.request.model
        request, ticket = ((item.request, None) if cache_plan is None
                           else await cache_plan.deal(item.request, group_keys.get(id(item))))
        if progress is not None:
            progress.in_flight += 1
        if cache_plan is not None and cache_plan.explicit is not None and id(item) in group_keys:
            referenced = await cache_plan.referencing(request, group_keys[id(item)])
            if referenced is not None:
                request = referenced
                if queue is not None:  # the cache is made: the group's held requests may go (the create warmed it)
                    queue.done(item, answered=True)
        try:
            hooks = _background_hooks(sink, item) if background and runs_in_background(request) else None
            result = await (client.chat(request, **hooks) if hooks else client.chat(request))
        except asyncio.CancelledError:
            if cache_plan is not None:
                cache_plan.unanswered(ticket)
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, none is lost
            if cache_plan is not None:
                cache_plan.unanswered(ticket)
            if _split_again(item, exc):
                # Refused before any work (so not billed): one text may be the reason, or the pack's size.
                logger.info("%d texts sent together were refused (%s); sending them in two halves",
                            len(item.parts), exc)
                for half in _halves(item):
                    await send(half)
                return
            if not isinstance(exc, APIError):
                logger.exception("unexpected error sending prompt ids %s", item.prompt_ids[:3])
            if stop is not None:
                await stop.failed(model, exc)
            await record_failure(item, exc)
        else:
            answered.add(id(item))
            if cache_plan is not None and id(item) in group_keys:
                cache_plan.answered(group_keys[id(item)], result, model=model, ticket=ticket)
            if stop is not None:
                await stop.answered(model)
            if item.parts:
                await packed(item, result)
                return
            schema = answer_schema(item.request.params)
            result = checked(result, schema)
            await sink.success(prompt_ids=item.prompt_ids, result=result, route=item.request.lane or "realtime",
                               model=model)
            # A violation comes only with a schema.
            if schema is not None and result.violation is not None and max_reasks:
                result = await reask(client=client, item=item, result=result, schema=schema, sink=sink,
                                     max_reasks=max_reasks, outcome=outcome, budget=budget)
            if result.violation is not None:
                outcome.invalid += len(item.prompt_ids)
            elif result.refusal is None:
                # Valid after a re-ask counts as succeeded too (and in ``valid_after_reask``).
                outcome.succeeded += len(item.prompt_ids)
            else:
                outcome.refused += len(item.prompt_ids)
            if progress is not None:
                progress.succeeded += 1
        finally:
            if progress is not None:
                progress.in_flight -= 1

    async def record_failure(item: WorkItem, exc: BaseException) -> None:
        for number, part in enumerate(item.parts or (item,)):
            # What a 2xx with no usable answer said it used is the request's: priced once, on its first text.
            error = exc if number == 0 or getattr(exc, "usage", None) is None else _without_usage(exc)
            await sink.failure(prompt_ids=part.prompt_ids, error=error, final=True, model=part.request.model)
        outcome.failed += len(item.prompt_ids)
        outcome.failed_by_class[type(exc).__name__] += len(item.prompt_ids)
        if progress is not None:
            progress.failed += len(item.parts) or 1

    async def packed(item: WorkItem, result: ChatResult) -> None:
        """A packed request's answer, a result per text (``unpack_embeddings``)."""
        try:
            answers = unpack_embeddings(result, [embedding_text(part.request.messages) or ""
                                                 for part in item.parts])
        except APIError as exc:
            await record_failure(item, exc)
            return
        for part, answer in zip(item.parts, answers):
            await sink.success(prompt_ids=part.prompt_ids, result=answer, model=part.request.model)
        outcome.succeeded += len(item.prompt_ids)
        if progress is not None:
            progress.succeeded += len(item.parts)

    async def taken() -> WorkItem | None:
        return next(pending, None) if queue is None else await queue.next()

    async def worker() -> None:
        nonlocal finished
        while (item := await taken()) is not None:
            if stop is None or stop.clear(item.request.model):
                await send(item)
            else:
                async with stop.turn(item.request.model) as go:
                    if go:
                        await send(item)
                    else:
                        left.append(item)
            if queue is not None:
                queue.done(item, answered=id(item) in answered)
            finished += 1
            if finished >= low_water:
                dispatched()

    # A fixed pool of workers pulling from one iterator: no task per item.
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
    finally:
        dispatched()  # also with nothing to send, or when the run fails: the caller must not wait forever
    if left or unfunded:
        await sink.release(prompt_ids=[pid for item in (*left, *unfunded) for pid in item.prompt_ids])
        for item in left:  # left only by a stop
            outcome.left += len(item.prompt_ids)
            if stop is not None:
                stop.left(item.request.model, len(item.prompt_ids))
        outcome.over_budget += sum(len(item.prompt_ids) for item in unfunded)
    return outcome


def _split_again(item: WorkItem, error: BaseException) -> bool:
    """Whether a packed request failed for its content, refused before any work: a 400, or a 413 for its size."""
    return (len(item.parts) > 1 and isinstance(error, APIStatusError) and error.status_code in (400, 413)
            and not getattr(error, "maybe_billed", 0))


def _halves(item: WorkItem) -> list[WorkItem]:
    """A packed item's texts as two packed items (or single ones)."""
    middle = len(item.parts) // 2
    return [*pack_work(item.parts[:middle], limits=PackLimits(max_inputs=middle)),
            *pack_work(item.parts[middle:], limits=PackLimits(max_inputs=len(item.parts) - middle))]


def _without_usage(error: BaseException) -> BaseException:
    copied = copy.copy(error)
    copied.usage = None  # type: ignore[attr-defined]
    return copied
