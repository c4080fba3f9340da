"""Building each attempt's ``httpx.Request``: the base URL, headers and timeouts are merged once, up front.

httpx.AsyncClient merges its URL, headers and cookies into every request it sends; at thousands of
requests a second that costs more CPU than the exchange itself, so the client builds requests here.
"""

from __future__ import annotations

import json as _json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["ACCEPT_ENCODING", "USER_AGENT", "RequestBuilder", "encode_json", "path_segment"]

USER_AGENT = "llm-dispatch"
# gzip and deflate only: any transport decodes those two, whatever else is installed.
ACCEPT_ENCODING = "gzip, deflate"
_URL_CACHE_SIZE = 256
# Built once: json.dumps with options builds a new encoder per call.
encode_json = _json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class RequestBuilder:
    """Requests for one API: ``base_url`` (its query goes on every path), fixed headers and timeouts."""

    def __init__(self, *, base_url: httpx.URL, headers: Mapping[str, str], timeout: httpx.Timeout) -> None:
        # Kept apart so a base URL with a query (Azure's ?api-version=...) keeps it on every path.
        self._base = str(base_url.copy_with(query=None)).rstrip("/")
        self._base_params = base_url.params
        self._urls: dict[str, httpx.URL] = {}
        # Complete up front, Host included: no transport adds a header of its own.
        self._headers = httpx.Headers(
            {"Host": base_url.netloc.decode("ascii"), "Accept": "*/*", "Accept-Encoding": ACCEPT_ENCODING,
             "User-Agent": USER_AGENT, **headers}
        )
        self._json_headers = httpx.Headers({**self._headers, "Content-Type": "application/json"})
        self._extensions = {"timeout": timeout.as_dict()}

    def build(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        json_body: bytes | None = None,
        files: Any = None,
        data: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """A request with its body read and its headers complete; ``params`` merge with the base URL's query.
        ``json_body`` is a JSON body encoded already (one too large to hold as objects)."""
        url = self._url(path, params)
        if files is not None or data is not None:
            return httpx.Request(method, url, headers=self._headers, files=files, data=data, extensions=self._extensions)
        if json_body is not None:
            headers, content = self._json_headers, json_body
        elif json is None:
            headers, content = self._headers, b""
        else:
            headers, content = self._json_headers, encode_json(json).encode()
        # Every request gets headers of its own (a transport may change them); the fixed ones are copied, not parsed.
        headers = httpx.Headers(headers, encoding="ascii")
        if content or method in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(content))
        return _ReadRequest(method, url, headers=headers, body=content, extensions=self._extensions)

    def _url(self, path: str, params: Mapping[str, str] | None) -> httpx.URL:
        if params is not None:
            return httpx.URL(self._base + path, params=self._base_params.merge(params))
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= _URL_CACHE_SIZE:  # paths that name a file or a batch keep coming
                self._urls.clear()
            url = self._urls[path] = httpx.URL(self._base + path, params=self._base_params)
        return url


class _ReadRequest(httpx.Request):
    """A request made of parts already in their final form: an ``httpx.URL``, its own complete ``httpx.Headers``, the
    body as bytes (``content`` ready, nothing to ``read()``).

    ``httpx.Request.__init__`` would copy the URL and the headers again, and its ``read()`` drain the stream into a
    second copy of the body; the attributes it sets are set here as they would end up.
    """

    def __init__(
        self, method: str, url: httpx.URL, *, headers: httpx.Headers, body: bytes, extensions: Mapping[str, Any]
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.extensions = dict(extensions)
        self.stream = httpx.ByteStream(body)
        self._content = body


def path_segment(resource_id: str) -> str:
    """An id as one path segment: a stray "/" or "?" in it must not reach another endpoint."""
    if not resource_id:
        raise ValueError("an empty id cannot name a file or a batch")
    return quote(resource_id, safe="")
