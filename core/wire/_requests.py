"""Building each attempt's ``httpx.Request``: the base URL, headers and timeouts are merged once, up front.

httpx.AsyncClient merges its URL, headers and cookies into every request it sends; at thousands of
requests a second that costs more CPU than the exchange itself, so the client builds requests here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from .._json import compact_json

__all__ = ["ACCEPT_ENCODING", "USER_AGENT", "RequestBuilder", "header_pairs", "path_segment"]

USER_AGENT = "llm-dispatch"
# gzip and deflate only: any transport decodes those two, whatever else is installed.
ACCEPT_ENCODING = "gzip, deflate"
_URL_CACHE_SIZE = 256


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
        # The same, as the str pairs a transport sends: a request built here carries them ready (``header_pairs``).
        self._pairs = _pairs(self._headers)
        self._json_pairs = _pairs(self._json_headers)
        self._extensions = {"timeout": timeout.as_dict()}
        # For an attempt whose deadline is no longer than the read timeout: that deadline bounds every read,
        # so the transport keeps no per-read timer (only the connect timeout stays).
        self._deadline_extensions = {"timeout": httpx.Timeout(None, connect=timeout.connect).as_dict()}
        self.read_timeout = timeout.read

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
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        silent: bool = False,
    ) -> httpx.Request:
        """A request with its body read and its headers complete; ``params`` merge with the base URL's query.
        ``json_body`` is a JSON body encoded already (one too large to hold as objects). ``deadline``: the
        attempt's own, when it has one (a read timeout no shorter than it is left out). ``silent``: no byte of the
        answer comes before it is whole (a completion, a batch created), so only the deadline bounds its reads.
        ``content``: raw bytes sent as they are (a chunk of a file); ``headers``: this request's own, beside the
        fixed ones (a resumable upload's commands)."""
        url = self._url(path, params)
        extensions = self._extensions
        if deadline is not None and (silent or self.read_timeout is not None and deadline <= self.read_timeout):
            extensions = self._deadline_extensions
        if files is not None or data is not None:
            return httpx.Request(method, url, headers=self._headers, files=files, data=data, extensions=extensions)
        if json_body is not None:
            pairs, content = self._json_pairs, json_body
        elif content is not None:
            pairs = self._pairs
        elif json is None:
            pairs, content = self._pairs, b""
        else:
            pairs, content = self._json_pairs, compact_json(json).encode()
        if headers:
            pairs = [*pairs, *headers.items()]
        if content or method in ("POST", "PUT", "PATCH"):
            pairs = [*pairs, ("Content-Length", str(len(content)))]
        return _ReadRequest(method, url, pairs=pairs, body=content, extensions=extensions)

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
    """A request made of parts already in their final form: an ``httpx.URL``, its complete headers as str pairs
    (``httpx.Headers`` made of them when first read), the body as bytes (``content`` ready, nothing to ``read()``).

    ``httpx.Request.__init__`` would copy the URL and parse the headers again, and its ``read()`` drain the stream
    into a second copy of the body; the attributes it sets are set here as they would end up.
    """

    def __init__(
        self, method: str, url: httpx.URL, *, pairs: list[tuple[str, str]], body: bytes, extensions: Mapping[str, Any]
    ) -> None:
        self.method = method
        self.url = url
        self._pairs = pairs
        self._headers: httpx.Headers | None = None
        self.extensions = dict(extensions)
        self.stream = httpx.ByteStream(body)
        self._content = body

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self._pairs, encoding="ascii")
        return self._headers

    @headers.setter
    def headers(self, value: httpx.Headers) -> None:
        self._headers = httpx.Headers(value)


def header_pairs(request: httpx.Request) -> list[tuple[str, str]]:
    """A request's headers as the str pairs that go on the wire; a request built here has them ready until its
    ``headers`` are read (and so may have been changed)."""
    if isinstance(request, _ReadRequest) and request._headers is None:
        return request._pairs
    return _pairs(request.headers)


def _pairs(headers: httpx.Headers) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers.raw]


def path_segment(resource_id: str) -> str:
    """An id as one path segment: a stray "/" or "?" in it must not reach another endpoint."""
    if not resource_id:
        raise ValueError("an empty id cannot name a file or a batch")
    return quote(resource_id, safe="")
