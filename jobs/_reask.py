"""A batch's invalid answers asked again: together, in a follow-up batch at the batch price while each prompt's
deadline leaves a batch's window, else at once in real time (``core.reask``), up to ``max_reasks`` times each.

The follow-up batch is an ordinary batch of the job (polled, ingested, resubmitted as any); its lines carry the
re-ask conversation, and its answers are numbered by ``storage.reask_levels`` when they are stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
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
    WorkItem,
    answer_schema,
    answer_text,
    reask,
    reask_messages,
)

from ._clients import Clients
from ._submit import advance_submission

__all__ = ["BATCH_WINDOW", "ReaskOutcome", "reask_invalid"]

logger = logging.getLogger(__name__)

# A batch answers within 24 hours (both providers' completion window).
BATCH_WINDOW: Final = timedelta(hours=24)


@dataclass(slots=True)
class ReaskOutcome:
    """What became of a batch's invalid answers: asked again in follow-up batches (their ids, the prompts in them),
    or in real time (prompts, and how many of those came back valid)."""

    batch_ids: list[int]
    batched: int = 0
    realtime: int = 0
    valid_realtime: int = 0


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
) -> ReaskOutcome:
    """Ask again the ``invalid`` answers of a batch (``(prompt_ids, result)``, identical prompts sharing one) whose
    prompts have re-asks left: ``levels`` gives each first prompt id the number of the answer just stored."""
    outcome = ReaskOutcome(batch_ids=[])
    left = [(ids, result) for ids, result in invalid if levels.get(ids[0], 0) < max_reasks]
    if not left:
        return outcome
    rows = {row.id: row for row in await storage.load_work(sessions, prompt_ids=[ids[0] for ids, _ in left])}
    late = now + BATCH_WINDOW + margin
    batched: dict[tuple[str, str, str], list[tuple[Sequence[int], ChatRequest, str]]] = {}
    for ids, result in left:
        row = rows.get(ids[0])
        if row is None:
            continue
        asked = ChatRequest(model=row.model, messages=row.messages, params=row.params, endpoint=row.endpoint)
        number = levels.get(ids[0], 0) + 1
        if row.deadline is not None and row.deadline < late:
            # No window left for a batch: at once, in real time, the rest of its re-asks.
            counts = DispatchOutcome()
            final = await reask(client=clients, item=WorkItem(prompt_ids=tuple(ids), request=asked), result=result,
                                schema=answer_schema(row.params) or {}, sink=writer, max_reasks=max_reasks,
                                outcome=counts, first=number)
            outcome.realtime += len(ids)
            outcome.valid_realtime += len(ids) if final.violation is None else 0
            continue
        again = ChatRequest(model=row.model, params=row.params, endpoint=row.endpoint,
                            messages=reask_messages(row.messages, answer=answer_text(result),
                                                    violation=result.violation or ""))
        provider = clients.provider_of(row.model)
        batched.setdefault((provider, row.model, row.endpoint), []).append((ids, again, f"p{ids[0]}r{number}"))
    for (provider, model, _), lines in batched.items():
        api = clients.batch_api(provider)
        files = BatchFileWriter(directory=Path(directory) / job_id, limits=api.limits(),
                                prefix=f"reask-{provider}-{now.strftime('%Y%m%d%H%M%S%f')}")
        members: dict[str, Sequence[int]] = {}
        done = []
        for ids, request, custom_id in lines:
            closed = files.add(custom_id, request)
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
                continue
            record = await storage.require_batch(sessions, batch_id=batch_id)
            await advance_submission(sessions=sessions, clients=clients, record=record)
            outcome.batch_ids.append(batch_id)
            outcome.batched += len(in_file)
    if outcome.batch_ids:
        logger.info("job %s: %d invalid answers asked again in %d follow-up batches", job_id, outcome.batched,
                    len(outcome.batch_ids))
    return outcome
