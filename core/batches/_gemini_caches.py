"""Gemini's explicit context caches (``cachedContents``) over a client's one send path: create, get, update, delete,
and the look-up of a create whose answer was lost by the displayName naming our job and group. The wire is
``wire._gemini_caches``'."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import httpx

from .._exceptions import NotFoundError
from .._json import compact_json
from ..wire._gemini_caches import (
    GEMINI_CACHES_PATH,
    CachedContent,
    parse_cached_content,
    parse_cached_content_page,
    ttl_text,
)
from ..wire._gemini import GEMINI_API_VERSION
from ..wire._responses import parse_json

if TYPE_CHECKING:
    from ..http._client import LLMClient

__all__ = ["GeminiCaches"]

# The list's largest page (ai.google.dev/api/caching: pageSize at most 1000), and the most a look-up reads.
_LIST_PAGE: Final = 1000
_LIST_MAX_PAGES: Final = 20


def _content(response: httpx.Response) -> CachedContent:
    return parse_cached_content(parse_json(response))


def _page(response: httpx.Response) -> tuple[list[CachedContent], str | None]:
    return parse_cached_content_page(parse_json(response))


class GeminiCaches:
    """The ``cachedContents`` of a client of the ``gemini`` wire."""

    def __init__(self, client: LLMClient) -> None:
        if client.wire != "gemini":
            raise ValueError(f"cachedContents are Gemini's API; this client speaks {client.wire}")
        self.client = client

    async def create(self, body: dict[str, Any]) -> CachedContent:
        """The cache ``body`` (``wire.cached_content_body``) describes; a retried create first looks for one whose
        answer was lost, by its displayName."""
        display = body.get("displayName")

        async def find_lost() -> CachedContent | None:
            return None if not display else await self.find(display)

        created: CachedContent = await self._call("POST", GEMINI_CACHES_PATH, json_body=compact_json(body).encode(),
                                                  parse=_content, find_lost=find_lost)
        return created

    async def get(self, name: str) -> CachedContent | None:
        """The cache ``name`` (``cachedContents/ID``), or None when Google knows it no more (deleted, expired)."""
        try:
            found: CachedContent = await self._call("GET", self._path(name), parse=_content)
        except NotFoundError:
            return None
        return found

    async def update(self, name: str, *, ttl_s: float) -> CachedContent | None:
        """The cache ``name`` kept ``ttl_s`` seconds from now; None when it is gone."""
        try:
            kept: CachedContent = await self._call("PATCH", self._path(name), json={"ttl": ttl_text(ttl_s)},
                                                   parse=_content)
        except NotFoundError:
            return None
        return kept

    async def delete(self, name: str) -> None:
        """Delete the cache ``name``; one already gone is no error."""
        try:
            await self._call("DELETE", self._path(name), parse=lambda _response: None)
        except NotFoundError:
            return

    async def find(self, display_name: str) -> CachedContent | None:
        """A live cache of ours named ``display_name``."""
        async for cache in self.listed():
            if cache.display_name == display_name:
                return cache
        return None

    async def listed(self) -> AsyncIterator[CachedContent]:
        token: str | None = None
        for _ in range(_LIST_MAX_PAGES):
            params = {"pageSize": str(_LIST_PAGE)}
            if token:
                params["pageToken"] = token
            caches, token = await self._call("GET", GEMINI_CACHES_PATH, params=params, parse=_page)
            for cache in caches:
                yield cache
            if not token:
                return

    async def _call(self, method: str, path: str, **options: Any) -> Any:
        return (await self.client._request(method, path, **options)).value

    @staticmethod
    def _path(name: str) -> str:
        if not name.startswith("cachedContents/") or "?" in name or ".." in name:
            raise ValueError(f"not a cached content's name: {name[:80]!r}")
        return f"/{GEMINI_API_VERSION}/{name}"
