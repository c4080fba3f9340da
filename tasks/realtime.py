"""Task: send one chunk of prompts as concurrent real-time calls, persisting each result as it lands."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect import State
from prefect.utilities.annotations import quote

from llm_dispatch import storage
from llm_dispatch.jobs import Chunk, SendChunk
from llm_dispatch.core import (
    REQUEST_ROUTES,
    CachePlan,
    ChatRequest,
    ChatSender,
    DispatchOutcome,
    RunStop,
    SpendGate,
    WorkItem,
    current_progress,
    send_all,
)

from ._names import parameter, prompts
from ._states import result_of, run_state


def _chunk_run_name() -> str:
    return f"send chunk {parameter('number')}/{parameter('of')} ({prompts(parameter('size'))})"


# retries=0: a chunk that ends Failed for its failed prompts did its work (stored); Prefect's default retries would
# send it again.
@task(name="send-chunk", task_run_name=_chunk_run_name, cache_policy=NO_CACHE, retries=0)
async def send_chunk(
    *,
    number: int,
    of: int,
    size: int,
    chunk: Chunk,
    client: ChatSender,
    sink: storage.ResultWriter,
    sessions: storage.Sessions,
    concurrency: int,
    before_send: Callable[[], Awaitable[None]] | None = None,
    on_dispatched: Callable[[], None] | None = None,
    stop: RunStop | None = None,
    max_reasks: int = 0,
    budget: SpendGate | None = None,
    cache_plan: CachePlan | None = None,
) -> State:
    """Send one request per group of identical prompts, at most ``concurrency`` at once.

    Holds one slot of the run's concurrency-limit tag while it runs (Prefect acquires it from the
    task's tags), so across all flow runs: requests in flight <= tag limit x ``concurrency``.
    ``before_send`` is awaited once the chunk is ready (rows loaded, prompts marked in flight) and
    before its first request; ``on_dispatched`` fires when about two rounds are left to finish. ``cache_plan``: the
    run's (``core.caching``), applied to each request and its warm-ups kept across chunks. ``stop``: the
    run's, which leaves a stopped provider's or model's prompts pending, unsent; ``budget``: the run's hold on its
    budget, which leaves them pending once the next request's worst case does not fit. An answer that breaks its
    schema is asked again at once, up to ``max_reasks`` times. Ends ``Failed`` when prompts failed (``chunk_state``).
    """
    requests = chunk.requests
    if requests is None:
        rows = await storage.load_work(sessions, prompt_ids=[group[0] for group in chunk.groups])
        requests = {row.id: ChatRequest(model=row.model, messages=row.messages, params=row.params,
                                        endpoint=row.endpoint, background_id=row.background_id,
                                        lane=row.planned_route if row.planned_route in REQUEST_ROUTES else None,
                                        lost_creates=row.background_creates - (row.background_id is not None))
                    for row in rows}
    await sink.mark_in_flight(prompt_ids=[pid for group in chunk.groups for pid in group])
    items = [WorkItem(prompt_ids=group, request=requests[group[0]]) for group in chunk.groups]
    if before_send is not None:
        await before_send()
    outcome = await send_all(client=client, items=items, sink=sink, concurrency=concurrency,
                             progress=current_progress.get(), on_dispatched=on_dispatched, stop=stop,
                             max_reasks=max_reasks, budget=budget, cache_plan=cache_plan)
    return chunk_state(outcome, size=size)


def chunk_state(outcome: DispatchOutcome, *, size: int) -> State:
    """A chunk with failed prompts ends ``Failed`` in the UI, its message counting them by class; the run goes on
    (its caller reads the outcome either way, by ``result_of``)."""
    if not outcome.failed:
        return run_state(outcome, message=f"{outcome.succeeded:,} of {prompts(size)} answered")
    classes = ", ".join(f"{name} {n}" for name, n in outcome.failed_by_class.most_common())
    return run_state(outcome, failure=f"{outcome.failed:,} of {prompts(size)} failed ({classes}); the run goes on")


def chunk_sender(*, tag: str) -> SendChunk:
    """``send_chunk`` under the concurrency-limit ``tag``, as ``jobs.ChunkSender`` calls it."""
    tagged = send_chunk.with_options(tags=[tag])

    async def send(*, chunk: Chunk, **kwargs: object) -> DispatchOutcome:
        # quote(): Prefect would otherwise walk every id of the chunk (and every group of the plan) looking for
        # futures, twice per task run.
        if kwargs.get("cache_plan") is not None:
            kwargs["cache_plan"] = quote(kwargs["cache_plan"])
        # Prefect types an async task called with return_state=True as its State, not the coroutine it is.
        state = await tagged(chunk=quote(chunk), size=chunk.prompts, return_state=True,  # type: ignore[misc]
                             **kwargs)
        outcome: DispatchOutcome = await result_of(state)
        return outcome

    return send
