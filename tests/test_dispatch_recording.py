"""The dispatch flow stores a new job while it sends its urgent prompts: routed and priced by the check pass, the
first requests out before the rest is stored, the Batch API given the bulk ones once all are stored."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from conftest import Sim, rows, write_prompts
from llm_dispatch import storage
from llm_dispatch.core import EstimateSums, PriceTable, to_json
from llm_dispatch.flows.dispatch import dispatch
from llm_dispatch.jobs import routing_rules
from llm_dispatch.jobs._costs import counted_prompts
from llm_dispatch.jobs._prompt_rows import CheckPassEstimate, new_prompts
from llm_dispatch.jobs._record import prompt_input
from llm_dispatch.core import Settings


def mixed(count: int) -> list[dict[str, object]]:
    """Urgent and bulk prompts in turn, one request asked three times across the input (twice urgent, once bulk)."""
    records: list[dict[str, object]] = [
        {"id": i, "prompt": f"question {i}: " + "words " * 40, "urgency": "urgent" if i % 2 else "bulk"}
        for i in range(count)]
    same = {"prompt": "the same question, asked again", "params": {"temperature": 0, "reasoning_effort": "none"}}
    records[1] = {"id": 1, "urgency": "urgent", **same}
    records[count - 1] = {"id": count - 1, "urgency": "urgent", **same}
    records[count - 2] = {"id": count - 2, "urgency": "bulk", **same}
    return records


def test_the_check_pass_sums_the_estimate_the_store_would(tmp_path: Path) -> None:
    """Routed and summed as the check reads the input, the estimate is the one a job stored whole sums as it is
    stored: the same lanes, an identical request once per half."""
    settings = Settings(route_policy="length")
    given = prompt_input(write_prompts(tmp_path / "p.jsonl", mixed(40)), settings=settings)
    assert given.table is not None
    now = datetime.now(UTC)
    ahead = CheckPassEstimate(table=given.table, rules=routing_rules(settings), now=now, dedupe=True)
    checked = given.check(each=ahead)
    stored = EstimateSums(table=given.table)
    for _ in counted_prompts(new_prompts(given.specs(), rules=routing_rules(settings), now=now, table=given.table),
                             sums=stored, dedupe=True, repeated=checked.repeated_keys):
        pass

    def totals(sums: EstimateSums) -> tuple[object, ...]:
        found, bound, unbounded = sums.totals(reply_tokens={settings.model: 100}, provider_of=lambda _: "openai")
        return found.realtime, found.batch, found.lanes, bound, unbounded

    assert ahead.seen == checked.count == 40 and ahead.batched == 20
    assert totals(ahead.sums) == totals(stored)
    realtime, batch = totals(ahead.sums)[:2]
    assert (realtime.prompts, batch.prompts) == (19, 20)  # type: ignore[attr-defined]


def test_a_job_larger_than_memory_keeps_is_stored_from_its_check_not_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check keeps every prompt (more than memory keeps: in a temporary file), so the store reads no input again:
    the prompts stored are the ones checked, from any position, even once the file is gone."""
    from llm_dispatch.core.inputs import _kept
    from llm_dispatch.jobs import _record

    monkeypatch.setattr(_record, "KEEP_CHECKED", 5)
    monkeypatch.setattr(_kept, "BLOCK", 4)
    path = write_prompts(tmp_path / "p.jsonl", mixed(23))
    given = prompt_input(path, settings=Settings())
    read = list(given.specs())
    checked = given.check()
    path.unlink()
    assert checked.count == 23
    for start in (0, 3, 5, 6, 9, 13, 22, 23):
        assert list(given.specs(start=start, checked=checked)) == read[start:]


def test_with_no_room_for_the_kept_file_the_store_reads_the_input_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A temporary file that cannot be written (disk full) costs a second read of the input, never the run."""
    from llm_dispatch.core.inputs import _kept
    from llm_dispatch.jobs import _record

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_record, "KEEP_CHECKED", 5)
    monkeypatch.setattr(_kept, "BLOCK", 4)
    monkeypatch.setattr(_kept.tempfile, "TemporaryFile", no_space)
    path = write_prompts(tmp_path / "p.jsonl", mixed(23))
    given = prompt_input(path, settings=Settings())
    read = list(given.specs())
    checked = given.check()
    assert checked.count == 23
    assert list(given.specs(start=0, checked=checked)) == read
    assert list(given.specs(start=9, checked=checked)) == read[9:]


@pytest.mark.prefect
async def test_dispatch_sends_while_the_rest_is_stored(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job bigger than its first chunks sends its urgent prompts before the rest is stored; the bulk ones go to
    the Batch API once every prompt is stored; the estimate counts every prompt of both halves; nothing is lost."""
    from llm_dispatch.core import LLMClient

    path = write_prompts(tmp_path / "p.jsonl", mixed(130))
    events: list[tuple[str, int]] = []
    add_prompts, chat = storage.add_prompts, LLMClient.chat

    async def recording(*args: object, **kwargs: object) -> int:
        stored = await add_prompts(*args, **kwargs)  # type: ignore[arg-type]
        events.append(("stored", stored))
        return stored

    async def sending(self: LLMClient, *args: object, **kwargs: object) -> object:
        events.append(("request", 1))
        return await chat(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "add_prompts", recording)
    monkeypatch.setattr(LLMClient, "chat", sending)
    sim.configure(latency=0.05)

    summary = to_json(await dispatch(prompts=str(path), base_url=sim.base_url, database_url=SecretStr(db_url),
                                     concurrency=4, chunk_size=10))

    slices = [n for kind, n in events if kind == "stored"]
    assert slices == [10, 10, 20, 40, 50]  # the first chunk's worth, then the rest in growing slices
    stored_at = [i for i, (kind, _) in enumerate(events) if kind == "stored"]
    assert events.index(("request", 1)) < stored_at[1]  # the first request left before the rest was stored
    routes = dict(rows(db_url, "SELECT planned_route, COUNT(*) FROM prompts GROUP BY planned_route"))
    assert routes == {"realtime": 65, "batch": 65}
    # Every urgent prompt answered once (the repeated request once for its two urgent prompts), every bulk one batched.
    assert dict(rows(db_url, "SELECT status, COUNT(*) FROM prompts GROUP BY status")) == {
        "succeeded": 65, "batched": 65}
    assert sim.stats()["requests_total"] == 64
    batches = httpx.get(f"{sim.base_url}/batches", params={"limit": 100}, timeout=5).raise_for_status().json()["data"]
    assert sum(batch["request_counts"]["total"] for batch in batches) == 65
    estimate = summary["estimate"]["routes"]
    assert (estimate["realtime"]["requests"], estimate["batch"]["requests"]) == (64, 65)
    assert rows(db_url, "SELECT status FROM jobs") == [("running",)]  # its batches are still open
