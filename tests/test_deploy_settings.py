"""What a deployed flow takes from Prefect: the API key from a Secret block (never stored or logged),
the concurrency limit on the real-time tag (created when missing), and shards that never share a prompt."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr

from conftest import Sim, rows
from llm_dispatch.core import to_json
from llm_dispatch.flows.dispatch import dispatch

pytestmark = [pytest.mark.prefect]


async def test_api_key_from_a_secret_block_is_used_and_never_stored(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from prefect.blocks.system import Secret

    key = f"sk-block-{uuid.uuid4().hex}"
    await Secret(value=key).save("llm-test-key", overwrite=True)
    sim.configure(api_key=key)  # anything else is a 401
    monkeypatch.setenv("LLM_DISPATCH_API_KEY_BLOCK", "llm-test-key")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("LLM_DISPATCH_API_KEY", raising=False)
    try:
        summary = to_json(await dispatch(prompts=[{"id": "a", "prompt": "hello"}, {"id": "b", "prompt": "doc " * 400}],
                                         base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                                         batch_poll_interval=0.2))
    finally:
        sim.configure(api_key=None)
    assert summary["counts"] == {"succeeded": 2}
    database = Path(db_url.split("///", 1)[1]).read_bytes()
    assert key.encode() not in database
    assert key not in caplog.text and key not in repr(summary)
    assert rows(db_url, "SELECT settings FROM jobs")[0][0].count("api_key_set") == 1


async def test_a_missing_secret_block_says_what_to_do(prefect_api: str, sim: Sim, db_url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_dispatch.core import ConfigError

    monkeypatch.setenv("LLM_DISPATCH_API_KEY_BLOCK", "no-such-block")
    with pytest.raises(ConfigError, match="no Prefect Secret block named 'no-such-block'"):
        await dispatch(prompts=[{"id": "a", "prompt": "hi"}], base_url=sim.base_url, database_url=SecretStr(db_url))
    assert sim.stats()["requests_total"] == 0


async def test_the_tag_limit_is_created_when_missing_and_left_alone_when_set(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client

    tag = f"llm-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("LLM_DISPATCH_TAG_LIMIT", "3")
    await dispatch(prompts=[{"id": "a", "prompt": "hi"}], base_url=sim.base_url, database_url=SecretStr(db_url),
                   concurrency_tag=tag)
    async with get_client() as client:
        assert (await client.read_concurrency_limit_by_tag(tag)).concurrency_limit == 3
        await client.create_concurrency_limit(tag=tag, concurrency_limit=5)  # an operator changes it
    await dispatch(prompts=[{"id": "b", "prompt": "hi again"}], base_url=sim.base_url,
                   database_url=SecretStr(db_url), concurrency_tag=tag)
    async with get_client() as client:
        assert (await client.read_concurrency_limit_by_tag(tag)).concurrency_limit == 5
        await client.delete_concurrency_limit_by_tag(tag)


async def test_shards_split_a_job_without_overlap(db_url: str) -> None:
    from llm_dispatch import storage
    from llm_dispatch.core._types import dedupe_key

    engine = storage.create_engine(db_url)
    await storage.migrate(engine)
    sessions = storage.session_factory(engine)
    try:
        job_id = await storage.create_job(sessions, name="s", fingerprint="s" * 64, input_path=None, model="m",
                                          settings={})
        messages = [{"role": "user", "content": "x"}]
        await storage.add_prompts(sessions, job_id=job_id, prompts=[
            storage.NewPrompt(custom_id=str(i), position=i, model="m", messages=messages, params={},
                              dedupe_key=dedupe_key(model="m", messages=messages, params={})) for i in range(101)])
        everything = await storage.unfinished_prompt_ids(sessions, job_id=job_id)
        shards = [await storage.unfinished_prompt_ids(sessions, job_id=job_id, shard=(i, 3)) for i in range(3)]
        assert sorted(pid for shard in shards for pid in shard) == sorted(everything)
        assert all(33 <= len(shard) <= 34 for shard in shards)
        with pytest.raises(ValueError, match="shard index"):
            await storage.unfinished_prompt_ids(sessions, job_id=job_id, shard=(3, 3))
    finally:
        await engine.dispose()
