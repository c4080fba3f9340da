"""The simulator's Gemini explicit context caches (``v1beta/cachedContents``), kept in memory, as the API shapes them
(google-genai ``caches.py``; ai.google.dev/api/caching):

    POST   /v1beta/cachedContents        {"model": "models/M", "contents"?, "systemInstruction"?, "tools"?,
                                          "toolConfig"?, "ttl": "Ns" | "expireTime", "displayName"?} -> CachedContent
    GET    /v1beta/cachedContents?pageSize=&pageToken=    {"cachedContents": [...], "nextPageToken"?}
    GET    /v1beta/cachedContents/{id}   a CachedContent; 404 NOT_FOUND once deleted or expired
    PATCH  /v1beta/cachedContents/{id}   {"ttl"} or {"expireTime"}: a new expiry
    DELETE /v1beta/cachedContents/{id}   {}

A CachedContent: name, displayName, model, createTime, updateTime, expireTime, usageMetadata.totalTokenCount (the
cached turns counted as generateContent counts them). The TTL defaults to one hour; a cache whose expiry has passed is
gone. ``generateContent`` with ``cachedContent`` reads it (``_gemini.resolve_cache``): the cache's turns before the request's, its
``cachedContentTokenCount`` the cache's tokens; a request naming an unknown or expired cache is answered 404, one that
repeats ``systemInstruction``, ``tools`` or ``toolConfig`` 400, as Google answers. Storage is not billed here; the
usage is reported.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ._gemini import as_chat, gemini_error
from ._state import SimState
from ._tokens import message_token_counts

__all__ = ["CACHES_PATH", "SimCache", "register"]

CACHES_PATH = "/v1beta/cachedContents"
_DEFAULT_TTL_S = 3600.0  # "If not set, the TTL defaults to 1 hour."
_CACHED_FIELDS = ("contents", "systemInstruction", "tools", "toolConfig")
_CREATE_FIELDS = frozenset({"model", "displayName", "ttl", "expireTime", *_CACHED_FIELDS})
_PAGE = 100


@dataclass(slots=True)
class SimCache:
    name: str
    display_name: str | None
    model: str  # without "models/"
    parts: dict[str, Any]  # the cached fields of a generateContent body
    tokens: int
    created: float  # wall seconds
    updated: float
    expires: float

    def resource(self) -> dict[str, Any]:
        found: dict[str, Any] = {"name": self.name, "model": f"models/{self.model}", "createTime": _rfc3339(self.created),
                                 "updateTime": _rfc3339(self.updated), "expireTime": _rfc3339(self.expires),
                                 "usageMetadata": {"totalTokenCount": self.tokens}}
        if self.display_name is not None:
            found["displayName"] = self.display_name
        return found


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _store(state: SimState) -> dict[str, SimCache]:
    """The live caches of ``state``, the expired dropped."""
    caches: dict[str, SimCache] = state.gemini_caches
    now = time.time()
    for name in [name for name, cache in caches.items() if cache.expires <= now]:
        del caches[name]
    return caches


def _error(status: int, message: str, word: str) -> web.Response:
    return gemini_error(status, message, word=word)


def _expiry(body: dict[str, Any], *, now: float, default: float | None) -> float | str:
    """The expiry ``ttl`` or ``expireTime`` sets (wall seconds), ``default`` for neither, or Google's 400 message."""
    if "ttl" in body and "expireTime" in body:
        return "Only one of ttl and expire_time may be set."
    ttl, expire = body.get("ttl"), body.get("expireTime")
    if isinstance(ttl, str) and ttl.endswith("s"):
        try:
            return now + float(ttl[:-1])
        except ValueError:
            pass
        return f"Invalid value at 'cached_content.ttl' ({ttl!r}): a duration in seconds, like \"3600s\"."
    if isinstance(expire, str):
        try:
            return datetime.fromisoformat(expire.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return f"Invalid value at 'cached_content.expire_time' ({expire!r})."
    if ttl is not None or expire is not None:
        return "Invalid value at 'cached_content.ttl': a duration in seconds, like \"3600s\"."
    return "ttl or expire_time is required" if default is None else now + default


def cached_tokens(parts: dict[str, Any]) -> int:
    """The cached turns' tokens, each counted as generateContent counts it."""
    return sum(message_token_counts(as_chat({"contents": parts.get("contents") or [], **parts}, model="")["messages"]))


class _CacheRoutes:
    def __init__(self, state: SimState) -> None:
        self._state = state

    def _refused(self, request: web.Request) -> web.Response | None:
        expected = self._state.config.api_key
        if expected is not None and request.headers.get("x-goog-api-key") != expected:
            return _error(403, "Method doesn't allow unregistered callers.", "PERMISSION_DENIED")
        return None

    async def create(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Invalid JSON payload received.", "INVALID_ARGUMENT")
        if not isinstance(body, dict):
            return _error(400, "Invalid JSON payload received. Expected an object.", "INVALID_ARGUMENT")
        unknown = sorted(set(body) - _CREATE_FIELDS)
        if unknown:
            return _error(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.',
                          "INVALID_ARGUMENT")
        model = body.get("model")
        if not isinstance(model, str) or not model.startswith("models/"):
            return _error(400, "* CreateCachedContentRequest.cached_content.model: model is required, as "
                               "models/{model}", "INVALID_ARGUMENT")
        now = time.time()
        expires = _expiry(body, now=now, default=_DEFAULT_TTL_S)
        if isinstance(expires, str):
            return _error(400, expires, "INVALID_ARGUMENT")
        parts = {field: body[field] for field in _CACHED_FIELDS if body.get(field)}
        cache = SimCache(name=f"cachedContents/{secrets.token_hex(8)}", display_name=body.get("displayName"),
                         model=model.removeprefix("models/"), parts=parts, tokens=cached_tokens(parts),
                         created=now, updated=now, expires=expires)
        _store(self._state)[cache.name] = cache
        self._state.stats.gemini_caches += 1
        return web.json_response(cache.resource())

    def _found(self, request: web.Request) -> SimCache | web.Response:
        name = f"cachedContents/{request.match_info['cache']}"
        cache = _store(self._state).get(name)
        if cache is None:
            return _error(404, f"CachedContent not found (or permission denied): {name}", "NOT_FOUND")
        return cache

    async def get(self, request: web.Request) -> web.Response:
        found = self._refused(request) or self._found(request)
        return found if isinstance(found, web.Response) else web.json_response(found.resource())

    async def patch(self, request: web.Request) -> web.Response:
        found = self._refused(request) or self._found(request)
        if isinstance(found, web.Response):
            return found
        body = await request.json()
        now = time.time()
        expires = _expiry(body if isinstance(body, dict) else {}, now=now, default=None)
        if isinstance(expires, str):
            return _error(400, expires, "INVALID_ARGUMENT")
        found.expires, found.updated = expires, now
        if expires <= now:
            _store(self._state)
        return web.json_response(found.resource())

    async def delete(self, request: web.Request) -> web.Response:
        found = self._refused(request) or self._found(request)
        if isinstance(found, web.Response):
            return found
        del _store(self._state)[found.name]
        return web.json_response({})

    async def list(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        size = max(1, min(1000, int(request.query.get("pageSize") or _PAGE)))
        start = int(request.query.get("pageToken") or 0)
        caches = list(_store(self._state).values())
        page: dict[str, Any] = {"cachedContents": [cache.resource() for cache in caches[start:start + size]]}
        if start + size < len(caches):
            page["nextPageToken"] = str(start + size)
        return web.json_response(page)


def register(app: web.Application, state: SimState) -> None:
    routes = _CacheRoutes(state)
    state.reset_hooks.append(state.gemini_caches.clear)
    app.router.add_post(CACHES_PATH, routes.create)
    app.router.add_get(CACHES_PATH, routes.list)
    app.router.add_get(CACHES_PATH + "/{cache}", routes.get)
    app.router.add_patch(CACHES_PATH + "/{cache}", routes.patch)
    app.router.add_delete(CACHES_PATH + "/{cache}", routes.delete)
