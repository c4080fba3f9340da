"""A batch's invalid answers asked again: together, in a follow-up batch at the batch price while each prompt's
deadline leaves a batch's window, else at once in real time (``core.reask``), up to ``max_reasks`` times each.

The follow-up batch is an ordinary batch of the job (polled, ingested, resubmitted as any); its lines carry the
re-ask conversation, and its answers are numbered by ``storage.reask_levels`` when they are stored. Under a budget
each re-ask's worst case is reserved through the ledger before it goes (a follow-up line's at the batch price, held
by its batch as any batch's; a real-time one's for its call); one that does not fit is not asked, and its prompt
keeps its invalid answer.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from llm_dispatch import storage
from llm_dispatch.core import (
    BatchConflictError,
    BatchFileWriter,
    ChatRequest,
    ChatResult,
    DispatchOutcome,
    Route,
    WorkItem,
    answer_schema,
    answer_text,
    reask,
    reask_messages,
)

from ._clients import Clients
from ._submit import advance_submission

__all__ = ["BATCH_WINDOW", "ReaskOutcome", "reask_invalid", "reask_line_id", "reask_number"]

logger = logging.getLogger(__name__)

# A batch answers within 24 hours (both providers' completion window).
BATCH_WINDOW: Final = timedelta(hours=24)
# A follow-up line's custom_id: its first prompt's id and which re-ask it is.
_REASK_LINE: Final = re.compile(r"p(\d+)r(\d+)")


def reask_line_id(prompt_id: int, number: int) -> str:
    """The custom_id of a follow-up batch's line: prompt ``prompt_id`` asked again, its ``number``-th re-ask."""
    return f"p{prompt_id}r{number}"


def reask_number(custom_id: str) -> int | None:
    """Which re-ask a batch line is (``reask_line_id``'s ``number``), or None for a prompt's own request."""
    found = _REASK_LINE.fullmatch(custom_id)
    return int(found.group(2)) if found else None


@dataclass(slots=True)
class ReaskOutcome:
    """What became of a batch's invalid answers: asked again in follow-up batches (their ids, the prompts in them),
    or in real time (prompts, and how many of those came back valid); or not asked, their worst case beyond the
    budget (prompts)."""

    batch_ids: list[int]
    batched: int = 0
    realtime: int = 0
    valid_realtime: int = 0
    over_budget: int = 0


async def reask_invalid(
    *,
    sessions: storage.Sessions,
    clients: Clients,
    writer: storage.ResultWriter,
    job_id: str,
    invalid: Sequence[tuple[Sequence[int], ChatResult]],
    levels: dict[int, int],
    max_reasks: int,
    directory: Path,
    now: datetime,
    margin: timedelta,
    budget: storage.BudgetInfo | None = None,
) -> ReaskOutcome:
    """Ask again the ``invalid`` answers of a batch (``(prompt_ids, result)``, identical prompts sharing one) whose
    prompts have re-asks left: ``levels`` gives each first prompt id the number of the answer just stored.
    ``budget``: the run's, each re-ask's worst case reserved out of it first (see the module notes)."""
    outcome = ReaskOutcome(batch_ids=[])
    left = [(ids, result) for ids, result in invalid if levels.get(ids[0], 0) < max_reasks]
    if not left:
        return outcome
    rows = {row.id: row for row in await storage.load_work(sessions, prompt_ids=[ids[0] for ids, _ in left])}
    late = now + BATCH_WINDOW + margin
    batched: dict[tuple[str, str, str], list[tuple[Sequence[int], ChatRequest, str]]] = {}
    at_once: list[tuple[Sequence[int], ChatResult, storage.WorkRow, int]] = []
    for ids, result in left:
        row = rows.get(ids[0])
        if row is None:
            continue
        number = levels.get(ids[0], 0) + 1
        if row.deadline is not None and row.deadline < late:
            at_once.append((ids, result, row, number))  # no window left for a batch: at once, in real time
            continue
        again = ChatRequest(model=row.model, params=row.params, endpoint=row.endpoint,
                            messages=reask_messages(row.messages, answer=answer_text(result),
                                                    violation=result.violation or ""))
        provider = clients.provider_of(row.model)
        batched.setdefault((provider, row.model, row.endpoint), []).append((ids, again, reask_line_id(ids[0], number)))
    if at_once:
        await _reask_at_once(at_once, sessions=sessions, clients=clients, writer=writer, max_reasks=max_reasks,
                             budget=budget, job_id=job_id, outcome=outcome)
    if batched:
        async with _lease(sessions, budget=budget, writer=writer, job_id=job_id, route="batch",
                          block=sum(map(len, batched.values()))) as lease:
            for (provider, model, _), lines in batched.items():
                await _follow_up(lines, provider=provider, model=model, sessions=sessions, clients=clients,
                                 directory=Path(directory) / job_id, now=now, lease=lease, job_id=job_id,
                                 outcome=outcome)
    if outcome.batch_ids:
        logger.info("job %s: %d invalid answers asked again in %d follow-up batches", job_id, outcome.batched,
                    len(outcome.batch_ids))
    if outcome.over_budget:
        logger.warning("job %s: %d invalid answers not asked again: their worst case does not fit the budget; they "
                       "keep their invalid answer", job_id, outcome.over_budget)
    return outcome


@contextlib.asynccontextmanager
async def _lease(
    sessions: storage.Sessions, *, budget: storage.BudgetInfo | None, writer: storage.ResultWriter, job_id: str,
    route: Route, block: int,
) -> AsyncIterator[storage.BudgetLease | None]:
    """A hold on ``budget`` for re-asks sent on ``route`` (None without a budget), given back on the way out."""
    if budget is None:
        yield None
        return
    async with storage.BudgetLease(sessions, budget=budget, prices=writer.prices, job_id=job_id,  # type: ignore[arg-type]
                                   route=route, block=max(1, block)) as lease:
        yield lease


async def _reask_at_once(
    work: Sequence[tuple[Sequence[int], ChatResult, storage.WorkRow, int]],
    *,
    sessions: storage.Sessions,
    clients: Clients,
    writer: storage.ResultWriter,
    max_reasks: int,
    budget: storage.BudgetInfo | None,
    job_id: str,
    outcome: ReaskOutcome,
) -> None:
    """Each invalid answer asked again in real time, the rest of its re-asks; under a budget through a writer of
    their own that settles each answer's cost out of the lease that held it."""
    async with contextlib.AsyncExitStack() as stack:
        lease = await stack.enter_async_context(_lease(sessions, budget=budget, writer=writer, job_id=job_id,
                                                       route="realtime", block=len(work)))
        sink = writer if lease is None else await stack.enter_async_context(
            storage.ResultWriter(sessions, job_id=job_id, prices=writer.prices, budget=lease))
        for ids, result, row, number in work:
            asked = ChatRequest(model=row.model, messages=row.messages, params=row.params, endpoint=row.endpoint)
            counts = DispatchOutcome()
            final = await reask(client=clients, item=WorkItem(prompt_ids=tuple(ids), request=asked), result=result,
                                schema=answer_schema(row.params) or {}, sink=sink, max_reasks=max_reasks,
                                outcome=counts, first=number, budget=lease)
            if counts.reasks == 0:
                outcome.over_budget += len(ids)
                continue
            outcome.realtime += len(ids)
            outcome.valid_realtime += len(ids) if final.violation is None else 0


async def _follow_up(
    lines: Sequence[tuple[Sequence[int], ChatRequest, str]],
    *,
    provider: str,
    model: str,
    sessions: storage.Sessions,
    clients: Clients,
    directory: Path,
    now: datetime,
    lease: storage.BudgetLease | None,
    job_id: str,
    outcome: ReaskOutcome,
) -> None:
    """One model's re-ask lines as follow-up batches: each line's worst case reserved first (a line that does not
    fit is not asked), each recorded file's reservation handed to its batch, then uploaded and created."""
    api = clients.batch_api(provider)
    files = BatchFileWriter(directory=directory, limits=api.limits(),
                            prefix=f"reask-{provider}-{now.strftime('%Y%m%d%H%M%S%f')}")
    members: dict[str, Sequence[int]] = {}
    held: dict[str, int] = {}
    done = []
    for ids, request, custom_id in lines:
        if lease is not None:
            amount = await lease.reserve(request)
            if amount is None:
                outcome.over_budget += len(ids)
                continue
            held[custom_id] = amount
        closed = files.add(custom_id, clients.sent_as(request))
        if closed is not None:
            done.append(closed)
        members[custom_id] = ids
    done += files.close()
    for file in done:
        in_file = [(pid, custom_id) for custom_id in file.custom_ids for pid in members[custom_id]]
        try:
            batch_id = await storage.create_batch_record(
                sessions, job_id=job_id, model=model, members=in_file, file_path=str(file.path),
                provider=provider, endpoint=file.endpoint)
        except BatchConflictError as exc:
            logger.warning("follow-up batch file %s not sent: %s", file.path.name, exc)
            continue  # what its lines held goes back with the lease
        if lease is not None:
            await lease.hand_over(batch_id=batch_id, amount=sum(held.pop(c, 0) for c in file.custom_ids))
        record = await storage.require_batch(sessions, batch_id=batch_id)
        await advance_submission(sessions=sessions, clients=clients, record=record)
        outcome.batch_ids.append(batch_id)
        outcome.batched += len(in_file)
