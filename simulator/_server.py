"""Running a simulator: the aiohttp app and its route groups, in this loop, a thread, a child process or blocking.

Run it in the current loop (``async with Simulator(...)``), in a background thread
(``Simulator.in_thread``), in its own process (``Simulator.in_process``, or
``python -m llm_dispatch.simulator --port 8000``, which prints the base URL once it listens, then the Anthropic base URL),
or blocking with ``serve``. Routes come in groups registered by ``create_app``; see ``_chat`` for what a chat
request can meet, ``_batch`` for files and batches, ``_messages_route`` and ``_message_batches`` for Anthropic's
Messages and Message Batches, and ``_admin`` for the ``/_sim`` control routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from aiohttp import web

from llm_dispatch.core import LLMDispatchError

from . import _admin, _batch, _chat, _embeddings, _gemini_batches, _gemini_caches, _message_batches, _messages_route, _responses_route
from ._anthropic_http import anthropic_error
from ._config import SimulatorConfig
from ._http import SIM_PREFIX, error_response
from ._state import SimState

__all__ = [
    "DEFAULT_SIMULATOR_CONFIG",
    "SIM_STATE",
    "RouteGroup",
    "Simulator",
    "SIM_PREFIX",
    "anthropic_base_url",
    "create_app",
    "provider_base_url",
    "provider_prefix",
    "serve",
]

DEFAULT_SIMULATOR_CONFIG = SimulatorConfig()

# A route group adds its routes to the app, bound to the shared state; the two batch APIs' groups keep
# their batches in a store of their own (one per app), cleared through SimState.reset_hooks.
RouteGroup = Callable[[web.Application, SimState], None]
_ROUTE_GROUPS: tuple[RouteGroup, ...] = (
    _admin.register, _chat.register, _embeddings.register, _responses_route.register, _batch.register, _messages_route.register, _message_batches.register,
    _gemini_batches.register, _gemini_caches.register,
)

SIM_STATE = web.AppKey("sim_state", SimState)
# Each named provider's state, by name (the root app's).
SIM_PROVIDERS = web.AppKey("sim_providers", dict[str, SimState])

# Bodies up to this size are accepted; large prompts with images, and batch files later, need room.
_CLIENT_MAX_SIZE = 256 * 1024 * 1024
# Stopping waits this long for requests in progress (a hang would otherwise hold it for minutes).
_SHUTDOWN_TIMEOUT = 1.0
_PROCESS_START_TIMEOUT = 60.0


def create_app(
    *, config: SimulatorConfig, route_groups: Sequence[RouteGroup] = _ROUTE_GROUPS, providers: Sequence[str] = (),
) -> web.Application:
    """The simulator's aiohttp app: one ``SimState`` (also at ``app[SIM_STATE]``) shared by every route group.

    Each of ``providers`` (named providers beside the built-in three) is served under ``/p/NAME`` by an app of its
    own (``provider_prefix``): every API, with its own state, counters and batches, so one process serves several
    providers side by side and each one's traffic is told apart (``Simulator.stats(provider=NAME)``)."""
    app = _app(config=config, route_groups=route_groups, prefix="")
    states: dict[str, SimState] = {}
    for name in providers:
        served = _app(config=config, route_groups=route_groups, prefix=provider_prefix(name))
        states[name] = served[SIM_STATE]
        app.add_subapp(provider_prefix(name), served)
    app[SIM_PROVIDERS] = states
    return app


def _app(*, config: SimulatorConfig, route_groups: Sequence[RouteGroup], prefix: str) -> web.Application:
    state = SimState(config=config)
    app = web.Application(client_max_size=_CLIENT_MAX_SIZE)
    app[SIM_STATE] = state
    app[SIM_PREFIX] = prefix
    for register in route_groups:
        register(app, state)
    # Last, so every group's routes match first: unknown /v1 paths get a JSON 404, Anthropic's for a request
    # that carries anthropic-version, else OpenAI's.
    app.router.add_route("*", "/v1/{tail:.*}", _unknown_url)
    return app


def provider_prefix(name: str) -> str:
    """The path a named provider is served under: ``/p/NAME`` (its OpenAI base URL adds ``/v1``)."""
    if not name or "/" in name:
        raise LLMDispatchError(f"a simulated provider needs a name without '/', got {name!r}")
    return f"/p/{name}"


async def _unknown_url(request: web.Request) -> web.Response:
    message = f"Invalid URL ({request.method} {request.path})"
    if "anthropic-version" in request.headers:
        return anthropic_error(404, message)
    return error_response(status=404, message=message)


def anthropic_base_url(base_url: str) -> str:
    """The Anthropic base URL of a simulator whose (OpenAI) base URL is ``base_url``: the same server, without
    ``/v1``, since Anthropic's paths carry it. For the URL that ``in_thread`` and ``in_process`` yield."""
    return base_url.removesuffix("/v1")


def provider_base_url(base_url: str, name: str, *, wire: str = "openai") -> str:
    """The base URL of the named provider ``name`` on the simulator whose (OpenAI) base URL is ``base_url``, as a
    client of ``wire`` takes it: ``.../p/NAME/v1`` for OpenAI's wire, ``.../p/NAME`` for Anthropic's and Gemini's."""
    root = anthropic_base_url(base_url) + provider_prefix(name)
    return f"{root}/v1" if wire == "openai" else root


def _base_url(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"  # listening everywhere; the loopback address is the one that surely connects
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


class Simulator:
    """One simulator server in the current event loop, speaking OpenAI's and Anthropic's APIs on one port.

        async with Simulator(config=SimulatorConfig(latency=0.1)) as sim:
            openai = LLMClient(base_url=sim.base_url)  # http://127.0.0.1:PORT/v1
            claude = LLMClient(provider="anthropic", base_url=sim.anthropic_base_url, api_key="k")  # no /v1
    """

    def __init__(self, config: SimulatorConfig = DEFAULT_SIMULATOR_CONFIG, *, providers: Sequence[str] = ()) -> None:
        self._app = create_app(config=config, providers=providers)
        self._state = self._app[SIM_STATE]
        self._providers = self._app[SIM_PROVIDERS]
        self._runner: web.AppRunner | None = None
        self._base_url: str | None = None

    @property
    def config(self) -> SimulatorConfig:
        return self._state.config

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise LLMDispatchError("The simulator is not running; call `await simulator.start()` first.")
        return self._base_url

    @property
    def anthropic_base_url(self) -> str:
        """The base URL for Anthropic's API on the same server: the host, without ``/v1``."""
        return anthropic_base_url(self.base_url)

    @property
    def gemini_base_url(self) -> str:
        """The base URL for Gemini's API on the same server: the host (the client adds ``/v1beta``)."""
        return anthropic_base_url(self.base_url)

    def stats(self, *, provider: str | None = None) -> dict[str, Any]:
        """The same counters as ``GET /_sim/stats`` (a named provider's: ``GET /p/NAME/_sim/stats``), without a
        request."""
        if provider is None:
            return _admin.stats_snapshot(self._state)
        return _admin.stats_snapshot(self._providers[provider])

    def provider_base_url(self, name: str, *, wire: str = "openai") -> str:
        """A named provider's base URL on this server, as a client of ``wire`` takes it (OpenAI's with ``/v1``)."""
        return provider_base_url(self.base_url, name, wire=wire)

    async def start(self, *, host: str = "127.0.0.1", port: int = 0, reuse_port: bool = False) -> str:
        """Listen on ``host:port`` (0 picks a free port) and return the base URL, ending in ``/v1``.

        ``reuse_port``: several simulator processes may listen on one port (SO_REUSEPORT), the kernel spreading
        connections over them; each keeps its own counters and state."""
        if self._runner is not None:
            raise LLMDispatchError("The simulator is already running; stop it before starting it again.")
        # handler_cancellation: a request whose client went away (a timed-out hang) stops counting as in flight.
        runner = web.AppRunner(
            self._app, access_log=None, handle_signals=False, handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_TIMEOUT,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_port = runner.addresses[0][1]
        self._base_url = _base_url(host, bound_port)
        return self._base_url

    async def stop(self) -> None:
        runner, self._runner, self._base_url = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @classmethod
    @contextlib.contextmanager
    def in_thread(
        cls, config: SimulatorConfig = DEFAULT_SIMULATOR_CONFIG, *, host: str = "127.0.0.1", port: int = 0,
        providers: Sequence[str] = (),
    ) -> Iterator[str]:
        """Run a simulator on its own event loop in a background thread; yields the base URL (each of ``providers``
        at ``provider_base_url``)."""
        ready: Future[tuple[asyncio.AbstractEventLoop, asyncio.Event, str]] = Future()

        async def run() -> None:
            simulator = cls(config=config, providers=providers)
            try:
                url = await simulator.start(host=host, port=port)
            except BaseException as exc:
                ready.set_exception(exc)
                return
            stopping = asyncio.Event()
            ready.set_result((asyncio.get_running_loop(), stopping, url))
            try:
                await stopping.wait()
            finally:
                await simulator.stop()

        thread = threading.Thread(target=asyncio.run, args=(run(),), name="llm-dispatch-simulator", daemon=True)
        thread.start()
        try:
            loop, stopping, url = ready.result()
        except BaseException:
            thread.join()
            raise
        try:
            yield url
        finally:
            loop.call_soon_threadsafe(stopping.set)
            thread.join()

    @staticmethod
    @contextlib.contextmanager
    def in_process(
        config: SimulatorConfig = DEFAULT_SIMULATOR_CONFIG,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout: float = _PROCESS_START_TIMEOUT,
        providers: Sequence[str] = (),
    ) -> Iterator[str]:
        """Run a simulator in a child Python process (off the caller's CPU core); yields the base URL."""
        command = [
            sys.executable, "-m", "llm_dispatch.simulator",
            "--host", host, "--port", str(port), "--config-json", json.dumps(config.to_dict()),
            *(arg for name in providers for arg in ("--provider", name)),
        ]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            url = _read_ready_line(process, timeout=startup_timeout)
            yield url
        finally:
            _terminate(process)


def _read_ready_line(process: subprocess.Popen[str], *, timeout: float) -> str:
    stdout = process.stdout
    assert stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    # A thread, because a pipe read cannot time out portably.
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=timeout).strip()
    except queue.Empty:
        raise LLMDispatchError(
            f"The simulator process did not report ready within {timeout:g} s; see its stderr above."
        ) from None
    if not line.startswith("http"):
        code = process.wait()
        raise LLMDispatchError(
            f"The simulator process exited with code {code} before it was ready; see its stderr above."
        )
    return line


def _terminate(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


async def _serve_until_stopped(
    *, host: str, port: int, config: SimulatorConfig, on_ready: Callable[[str], None], providers: Sequence[str] = (),
    reuse_port: bool = False,
) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        # SIGTERM (e.g. from in_process) stops cleanly; not available off the main thread or on Windows.
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
    simulator = Simulator(config, providers=providers)
    on_ready(await simulator.start(host=host, port=port, reuse_port=reuse_port))
    try:
        await stopping.wait()
    finally:
        await simulator.stop()


def _print_url(url: str) -> None:
    # The OpenAI base URL first, alone on its line: in_process (and scripts) read that line as "ready".
    print(url, flush=True)
    print(f"Anthropic base URL: {anthropic_base_url(url)}", flush=True)


def serve(*, host: str, port: int, config: SimulatorConfig, on_ready: Callable[[str], None] = _print_url,
          providers: Sequence[str] = (), reuse_port: bool = False) -> None:
    """Serve until Ctrl-C or SIGTERM. ``on_ready`` gets the base URL once listening (default: print it); each of
    ``providers`` is served at ``provider_base_url``; with ``reuse_port`` several processes may share the port."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_until_stopped(host=host, port=port, config=config, on_ready=on_ready,
                                         providers=providers, reuse_port=reuse_port))

