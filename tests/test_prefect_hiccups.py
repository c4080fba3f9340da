"""A Prefect API that answers 503 now and then (an overloaded server) while a run follows its batches: every call
is tried again, the run finishes, every answer is stored once. A real Prefect server behind a real proxy that
refuses calls, a real flow run, the simulator's Batch API over real sockets."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
from aiohttp import web
from pydantic import SecretStr

from conftest import Sim, rows, successes_per_prompt
from llm_dispatch.core import to_json
from llm_dispatch.flows.dispatch import dispatch
from llm_dispatch.tasks import result_of

pytestmark = [pytest.mark.prefect]

# Headers that belong to one connection, not to the call passed on.
_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"})


class FlakyApi:
    """A reverse proxy in front of the Prefect API, on a thread and event loop of its own. It passes every call
    through (the events websocket too), except that it answers every other call 503 the first time it is made, as
    an overloaded server does (``Retry-After: 0``, so the test does not wait out the client's back-off); the same
    call made again passes, so no call is refused twice in a row."""

    def __init__(self, upstream: str) -> None:
        url = httpx.URL(upstream)
        self._upstream = f"{url.scheme}://{url.host}:{url.port}"
        self.refused: list[str] = []  # "METHOD /path" of each call answered 503
        self.passed = 0
        self._again: set[str] = set()  # calls refused once, passed when made again
        self._calls = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None
        self._thread = threading.Thread(target=self._serve, name="flaky-prefect-api", daemon=True)
        self.url = ""

    def __enter__(self) -> FlakyApi:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            self._session = session
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            self.url = f"http://127.0.0.1:{port}/api"
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._pipe(request)
        body = await request.read()
        call = f"{request.method} {request.rel_url}"
        key = hashlib.sha256(call.encode() + b"\0" + body).hexdigest()
        if key in self._again:
            self._again.discard(key)
        else:
            self._calls += 1
            if self._calls % 2:
                self._again.add(key)
                self.refused.append(f"{request.method} {request.path}")
                return web.Response(status=503, headers={"Retry-After": "0"}, text="Service Unavailable")
        self.passed += 1
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _HOP}
        async with self._session.request(request.method, self._upstream + str(request.rel_url), headers=headers,
                                         data=body, allow_redirects=False) as answer:
            payload = await answer.read()
            back = {name: value for name, value in answer.headers.items() if name.lower() not in _HOP}
            return web.Response(status=answer.status, body=payload, headers=back)

    async def _pipe(self, request: web.Request) -> web.WebSocketResponse:
        assert self._session is not None
        theirs = web.WebSocketResponse()
        await theirs.prepare(request)
        async with self._session.ws_connect("ws" + self._upstream.removeprefix("http") + str(request.rel_url)) as ours:

            async def pump(source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
                           sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse) -> None:
                async for message in source:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        await sink.send_str(message.data)
                    elif message.type == aiohttp.WSMsgType.BINARY:
                        await sink.send_bytes(message.data)
                    else:
                        break
                await sink.close()

            await asyncio.gather(pump(theirs, ours), pump(ours, theirs), return_exceptions=True)
        return theirs


@pytest.fixture
def flaky_api(prefect_api: str) -> Iterator[FlakyApi]:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # The process's events worker outlives this test: made now, it keeps talking to the server itself.
    EventsWorker.instance()
    with FlakyApi(prefect_api) as proxy, temporary_settings(updates={PREFECT_API_URL: proxy.url}):
        yield proxy
        APILogWorker.drain_all(timeout=60)  # the log lines sent through the proxy, before it stops


async def test_a_run_following_its_batches_rides_out_prefect_api_503s(
    flaky_api: FlakyApi, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client

    monkeypatch.setenv("LLM_DISPATCH_BATCH_MAX_REQUESTS", "6")
    sim.configure(batch_processing_seconds=0.5)
    state = await dispatch(prompts=[{"id": i, "prompt": f"question {i}"} for i in range(60)], route_policy="all-batch",
                           base_url=sim.base_url, database_url=SecretStr(db_url), wait=True, batch_poll_interval=0.2,
                           return_state=True)
    summary = to_json(await result_of(state))

    assert state.is_completed() and summary["counts"] == {"succeeded": 60}
    assert summary["batch"]["submitted_batches"] == 10
    # Each answer stored once; no prompt left pending or in a batch.
    assert set(successes_per_prompt(db_url).values()) == {1}
    assert rows(db_url, "SELECT status, COUNT(*) FROM batches GROUP BY status") == [("ingested", 10)]
    # The API did answer 503: to the run's state, and to the batches' progress artifact while they were followed.
    assert flaky_api.passed > len(flaky_api.refused) > 0
    assert any(call.endswith("/set_state") for call in flaky_api.refused)
    assert any(call.startswith(("POST /api/artifacts", "PATCH /api/artifacts/")) for call in flaky_api.refused)
    async with get_client() as client:
        run = await client.read_flow_run(state.state_details.flow_run_id)
    assert run.state is not None and run.state.is_completed()
