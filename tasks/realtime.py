"""Task: send one chunk of prompts as concurrent real-time calls, persisting each result as it lands."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from llm_dispatch._dispatch import ChatSender, DispatchOutcome, WorkItem, current_progress, send_all
from llm_dispatch._types import ChatRequest


@task(
    name="send-chunk",
    task_run_name="realtime chunk {number}/{of} ({size} prompts)",
    cache_policy=NO_CACHE,
)
async def send_chunk(
    *,
    number: int,
    of: int,
    size: int,
    groups: Sequence[tuple[int, ...]],
    client: ChatSender,
    sink: storage.ResultWriter,
    sessions: async_sessionmaker[AsyncSession],
    concurrency: int,
    before_send: Callable[[], Awaitable[None]] | None = None,
    on_dispatched: Callable[[], None] | None = None,
    requests: Mapping[int, ChatRequest] | None = None,
) -> DispatchOutcome:
    """Send one request per group of identical prompts, at most ``concurrency`` at once.

    Holds one slot of the run's concurrency-limit tag while it runs (Prefect acquires it from the
    task's tags), so across all flow runs: requests in flight <= tag limit x ``concurrency``.
    ``before_send`` is awaited once the chunk is ready (rows loaded, prompts marked in flight) and
    before its first request: the flow's turn-taking between chunks. ``on_dispatched`` fires when about
    one round of requests is left to send (see ``send_all``).
    ``requests``: each group's request by its first id, from a caller that has just stored the
    prompts and holds them still; otherwise they are loaded from storage.
    """
    ids = [pid for group in groups for pid in group]
    if requests is None:
        rows = await storage.load_work(sessions, prompt_ids=[group[0] for group in groups])
        requests = {row.id: ChatRequest(model=row.model, messages=row.messages, params=row.params) for row in rows}
    await sink.mark_in_flight(prompt_ids=ids)
    items = [WorkItem(prompt_ids=group, request=requests[group[0]]) for group in groups]
    if before_send is not None:
        await before_send()
    return await send_all(client=client, items=items, sink=sink, concurrency=concurrency,
                          progress=current_progress.get(), on_dispatched=on_dispatched)
