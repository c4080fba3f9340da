"""A run's clients: a prompt's model picks its provider's client; a missing key stops a run before it sends;
a Message Batch whose create answer was lost is found again by its size and time (respx, production send path)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch import storage
from llm_dispatch.jobs import Clients
from llm_dispatch.jobs._submit import adopted_by
from llm_dispatch.core import ChatRequest, ConfigError, LLMClient, Settings, batch_api

OPENAI = "https://api.openai.test/v1"
ANTHROPIC = "https://api.anthropic.test"


def settings(**fields: Any) -> Settings:
    return Settings(base_url=OPENAI, api_key="sk-openai", anthropic_base_url=ANTHROPIC,
                    anthropic_api_key="sk-ant-key", **fields)


def chat_answer(text: str) -> dict[str, Any]:
    return {"id": "c1", "model": "gpt-4o-mini", "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def message_answer(text: str) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 1}}


async def test_each_request_goes_to_its_models_provider() -> None:
    mock = respx.Router(assert_all_called=True, assert_all_mocked=True)
    openai = mock.post(f"{OPENAI}/chat/completions").respond(json=chat_answer("from openai"))
    anthropic = mock.post(f"{ANTHROPIC}/v1/messages").respond(json=message_answer("from anthropic"))
    clients = Clients(settings=settings(model_providers={"my-proxy": "anthropic"}),
                      transport=httpx.MockTransport(mock.async_handler))
    try:
        gpt = await clients.chat(ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "a"}]))
        claude = await clients.chat(ChatRequest(model="claude-haiku-4-5",
                                                messages=[{"role": "user", "content": "b"}], params={"max_tokens": 9}))
        mapped = await clients.chat(ChatRequest(model="my-proxy", messages=[{"role": "user", "content": "c"}]))
    finally:
        await clients.aclose()
    mock.assert_all_called()
    assert (gpt.text, claude.text, mapped.text) == ("from openai", "from anthropic", "from anthropic")
    assert openai.call_count == 1 and anthropic.call_count == 2
    sent = anthropic.calls[0].request
    assert sent.headers["x-api-key"] == "sk-ant-key" and "authorization" not in sent.headers
    assert openai.calls[0].request.headers["authorization"] == "Bearer sk-openai"


async def test_a_provider_without_a_key_is_refused_before_anything_is_sent() -> None:
    clients = Clients(settings=Settings(base_url=OPENAI, api_key="sk-openai", anthropic_base_url=ANTHROPIC))
    try:
        clients.require(["openai"])  # fine
        with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
            clients.require(["openai", "anthropic"])
    finally:
        await clients.aclose()


def message_batch(batch_id: str, *, created: datetime, total: int) -> dict[str, Any]:
    return {"id": batch_id, "type": "message_batch", "processing_status": "in_progress",
            "request_counts": {"processing": total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
            "created_at": created.isoformat(), "expires_at": (created + timedelta(hours=24)).isoformat(),
            "ended_at": None, "cancel_initiated_at": None, "archived_at": None, "results_url": None}


async def test_a_lost_message_batch_is_found_by_size_and_time_and_never_one_already_ours(tmp_path: Path) -> None:
    engine = storage.create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    await storage.migrate(engine)
    sessions = storage.session_factory(engine)
    job_id = await storage.create_job(sessions, name="t", fingerprint="f" * 64, input_path=None,
                                      model="claude-haiku-4-5", settings={})
    prompts = [storage.NewPrompt(custom_id=f"c{i}", position=i, model="claude-haiku-4-5",
                                 messages=[{"role": "user", "content": f"q{i}"}], params={}, dedupe_key=f"k{i}",
                                 planned_route="batch", route_reason="test") for i in range(5)]
    await storage.add_prompts(sessions, job_id=job_id, prompts=prompts)
    ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id)
    ours = await storage.create_batch_record(sessions, job_id=job_id, model="claude-haiku-4-5", provider="anthropic",
                                             members=[(pid, f"p{pid}") for pid in ids[:3]], file_path=None)
    other = await storage.create_batch_record(sessions, job_id=job_id, model="claude-haiku-4-5", provider="anthropic",
                                              members=[(pid, f"p{pid}") for pid in ids[3:]], file_path=None)
    await storage.update_batch(sessions, batch_id=other, provider_batch_id="msgbatch_taken", status="in_progress")
    record = await storage.get_batch(sessions, batch_id=ours)
    assert record is not None and record.request_total == 3
    now = record.created_at
    listing = [
        message_batch("msgbatch_taken", created=now + timedelta(seconds=3), total=3),   # already our other batch
        message_batch("msgbatch_wrong_size", created=now + timedelta(seconds=2), total=4),
        message_batch("msgbatch_ours", created=now + timedelta(seconds=1), total=3),
        message_batch("msgbatch_too_old", created=now - timedelta(hours=1), total=3),
    ]
    mock = respx.Router(assert_all_called=True, assert_all_mocked=True)
    route = mock.get(f"{ANTHROPIC}/v1/messages/batches").mock(side_effect=[
        httpx.Response(200, json={"data": listing[:2], "has_more": True, "first_id": "a", "last_id": "b"}),
        httpx.Response(200, json={"data": listing[2:], "has_more": True, "first_id": "c", "last_id": "d"}),
    ])
    async with LLMClient(provider="anthropic", base_url=ANTHROPIC, api_key="sk-ant-key",
                         transport=httpx.MockTransport(mock.async_handler)) as client:
        found = await batch_api(client).find(record=record, adopted=adopted_by(sessions))
    assert found is not None and found.id == "msgbatch_ours"
    # Paged with after_id, and stopped at the first batch older than the record (no third page asked for).
    assert route.call_count == 2 and route.calls[1].request.url.params["after_id"] == "msgbatch_wrong_size"
    await engine.dispose()


async def test_each_provider_has_a_batch_backend_of_its_own() -> None:
    from llm_dispatch.core import PROVIDERS
    from llm_dispatch.core import BACKENDS, BatchApi

    # Every provider has one, keyed by its wire: Gemini's is its Batch Mode.
    assert set(BACKENDS) == set(PROVIDERS)
    for provider, backend in BACKENDS.items():
        # Side by side, as curator's batch processors: none is a kind of another provider's.
        assert backend.__bases__ == (BatchApi,), provider
        assert not backend.__abstractmethods__, provider
        client = LLMClient.from_settings(settings(gemini_api_key="gemini-key"), provider=provider)
        try:
            assert type(batch_api(client)) is backend
        finally:
            await client.aclose()
