"""The simulator's ``/_sim`` control routes: stats, reset, runtime config and queued faults.

    GET  /_sim/health   {"ok": true}
    GET  /_sim/stats    counters (see SimStats) plus faults_queued, uptime_s and process_cpu_s
    POST /_sim/reset    zero the counters, per-body marker counts, queued faults, quotas, prompt cache
    GET  /_sim/config   the current config (api_key masked)
    POST /_sim/config   patch config fields, e.g. {"latency": 0.2, "rate_500": 0.1}
    GET  /_sim/faults   faults still queued
    POST /_sim/faults   {"faults": ["429", "500", "hang"]} answers the next real-time requests (chat completions
                        or Messages, whichever comes) with these, in order, each in its API's shape
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from llm_dispatch.core import ConfigError

from ._config import FAULTS
from ._http import error_response, json_response, read_json_object
from ._state import SimState

__all__ = ["register"]


def register(app: web.Application, state: SimState) -> None:
    """Add the ``/_sim`` control routes, bound to ``state``."""
    routes = _AdminRoutes(state)
    app.router.add_get("/_sim/health", routes.health)
    app.router.add_get("/_sim/stats", routes.stats)
    app.router.add_post("/_sim/reset", routes.reset)
    app.router.add_get("/_sim/config", routes.get_config)
    app.router.add_post("/_sim/config", routes.patch_config)
    app.router.add_get("/_sim/faults", routes.get_faults)
    app.router.add_post("/_sim/faults", routes.queue_faults)


def stats_snapshot(state: SimState) -> dict[str, Any]:
    return {
        **state.stats.to_dict(),
        "faults_queued": len(state.forced_faults),
        "uptime_s": round(time.time() - state.started_at, 3),
        # CPU used by the whole simulator process: what benchmarks divide by requests to show headroom.
        "process_cpu_s": round(time.process_time(), 4),
    }


def _bad_request(message: str) -> web.Response:
    return error_response(status=400, message=message)


async def _json_object(request: web.Request) -> dict[str, Any] | web.Response:
    body = await read_json_object(request)
    return body if body is not None else _bad_request("The body must be a JSON object.")


class _AdminRoutes:
    def __init__(self, state: SimState) -> None:
        self._state = state

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"ok": True})

    async def stats(self, request: web.Request) -> web.Response:
        return json_response(stats_snapshot(self._state))

    async def reset(self, request: web.Request) -> web.Response:
        self._state.reset()
        return json_response(stats_snapshot(self._state))

    def _config_view(self) -> dict[str, Any]:
        view = self._state.config.to_dict()
        if view["api_key"] is not None:
            view["api_key"] = "***"  # the control plane is unauthenticated; never echo the key
        return view

    async def get_config(self, request: web.Request) -> web.Response:
        return json_response(self._config_view())

    async def patch_config(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        try:
            config = self._state.config.updated(body)
        except ConfigError as exc:
            return _bad_request(str(exc))
        self._state.apply_config(config)
        return json_response(self._config_view())

    async def get_faults(self, request: web.Request) -> web.Response:
        return json_response({"faults": list(self._state.forced_faults)})

    async def queue_faults(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        faults = body.get("faults")
        if not isinstance(faults, list):
            return _bad_request('Send {"faults": [...]} with a list of faults.')
        names = [str(f) for f in faults]
        unknown = sorted(set(names) - FAULTS)
        if unknown:
            return _bad_request(f"Unknown fault(s) {unknown}; use any of {sorted(FAULTS)}.")
        self._state.forced_faults.extend(names)
        return json_response({"faults": list(self._state.forced_faults)})
