"""The client's default transport: aiohttp under httpx's transport API, one method wide.

``LLMClient`` builds an ``httpx.Request`` for every call and hands it to a transport; this one sends
it over an aiohttp connection pool. A test hands the client ``httpx.MockTransport`` (or respx)
instead, and so exercises the very path production takes.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Sequence

import aiohttp
import httpx
import yarl

from .._constants import DEFAULT_CONCURRENCY, DEFAULT_KEEPALIVE_EXPIRY
from ..wire._requests import header_pairs

__all__ = ["AiohttpTransport", "BodyCut", "default_transport", "raw_headers"]

# Bodies up to this size (with a Content-Length) are read in one call; larger or unsized ones stream.
BUFFER_LIMIT = 8 * 1024 * 1024
_STREAM_CHUNK = 64 * 1024
_URL_CACHE_SIZE = 256
# What no longer describes a body that aiohttp has decompressed.
_ENCODING_HEADERS = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})

RawHeaders = tuple[tuple[bytes, bytes], ...]
# Most specific first: the first class an aiohttp error is an instance of names its httpx error.
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientProxyConnectionError, httpx.ProxyError),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.ReadError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.ClientError, httpx.NetworkError),
    (OSError, httpx.NetworkError),
)


class BodyCut(httpx.ReadError):
    """The answer's status line and headers came, then its body failed before it was whole: the request reached
    the server, which answered (``status_code``); only the rest was lost."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def default_transport(*, concurrency: int = DEFAULT_CONCURRENCY, tls: bool = True) -> AiohttpTransport:
    """The transport ``LLMClient`` makes for itself: as many connections as requests may be in flight.

    ``tls=False`` is for a plain-http server (a local one, the simulator): it skips loading the CA
    bundle. Its TLS context still verifies, with no CA to trust, so an https URL sent through it
    fails instead of going unchecked.
    """
    context = httpx.create_ssl_context() if tls else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return AiohttpTransport(
        ssl_context=context,
        limits=httpx.Limits(
            max_connections=concurrency,
            max_keepalive_connections=concurrency,
            keepalive_expiry=DEFAULT_KEEPALIVE_EXPIRY,
        ),
    )


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends each ``httpx.Request`` over one aiohttp session, answering a plain ``httpx.Response``.

    The answer's body is decompressed (aiohttp decodes gzip and deflate, and the encoding headers are
    dropped so httpx does not decode again). A body with a Content-Length up to ``BUFFER_LIMIT`` is
    read whole, in one call, before the response is returned; a larger or unsized one (a download)
    streams. aiohttp's errors come out as httpx's, raised from the aiohttp error that says what
    happened. The connection limit is ``limits.max_connections`` (aiohttp's own default, 100, would
    silently cap a higher concurrency).
    """

    def __init__(self, *, ssl_context: ssl.SSLContext, limits: httpx.Limits) -> None:
        self.ssl_context = ssl_context
        self.limits = limits
        self._session: aiohttp.ClientSession | None = None
        # The client sends the same few URLs and timeouts again and again; each is converted once. A URL is looked up
        # by the httpx.URL object itself (kept in its entry, so its id cannot be reused): the client hands the same
        # one for every request to a path, and an httpx.URL spells itself out afresh on each str().
        self._urls: dict[int, tuple[httpx.URL, yarl.URL]] = {}
        self._extensions: dict[str, dict[str, bytes]] = {}
        self._timeouts: dict[tuple[float | None, float | None, float | None], aiohttp.ClientTimeout] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session
        if session is None:
            # Made here, not in __init__: an aiohttp session belongs to the loop that first uses it.
            connector = aiohttp.TCPConnector(
                limit=self.limits.max_connections or 0,
                keepalive_timeout=self.limits.keepalive_expiry,
                ssl=self.ssl_context,
            )
            session = self._session = aiohttp.ClientSession(connector=connector)
        try:
            data: bytes | httpx.AsyncByteStream | None = request.content or None
        except httpx.RequestNotRead:
            # A streamed body (a multipart upload); aiohttp frames it itself.
            # httpx types a request's stream as sync or async; an AsyncClient's is async.
            data = request.stream  # type: ignore[assignment]
            request.headers.pop("transfer-encoding", None)
        headers = header_pairs(request)
        try:
            response = await session.request(
                request.method, self._url(request.url), headers=headers, data=data,
                allow_redirects=False, timeout=self._timeout(request),
            )
        except Exception as exc:
            raise _httpx_error(exc)
        try:
            length = response.content_length
            body = await response.read() if length is not None and length <= BUFFER_LIMIT else None
        except BaseException as exc:
            # Cancelled (the attempt's deadline) or failed part way through: this connection cannot be reused.
            response.close()
            if isinstance(exc, Exception):
                cut = BodyCut(f"{type(exc).__name__}: {exc}".rstrip(": "), status_code=response.status)
                raise cut from _httpx_error(exc)
            raise
        raw_headers = response.raw_headers
        if "Content-Encoding" in response.headers:
            raw_headers = tuple(pair for pair in raw_headers if pair[0].lower() not in _ENCODING_HEADERS)
        extensions = self._response_extensions(response.reason)
        if body is None:
            return httpx.Response(
                response.status, headers=raw_headers, stream=_Streamed(response), request=request, extensions=extensions
            )
        response.release()
        return _ReadResponse(response.status, headers=raw_headers, body=body, request=request, extensions=extensions)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, url: httpx.URL) -> yarl.URL:
        known = self._urls.get(id(url))
        if known is not None and known[0] is url:
            return known[1]
        if len(self._urls) >= _URL_CACHE_SIZE:  # paths that name a file or a batch keep coming
            self._urls.clear()
        converted = yarl.URL(str(url), encoded=True)
        self._urls[id(url)] = (url, converted)
        return converted

    def _response_extensions(self, reason: str | None) -> dict[str, bytes]:
        # Shared by every answer with this reason phrase: httpx.Response copies the extensions it is given.
        extensions = self._extensions.get(reason or "")
        if extensions is None:
            extensions = {"http_version": b"HTTP/1.1"}
            if reason:
                extensions["reason_phrase"] = reason.encode()
            if len(self._extensions) < _URL_CACHE_SIZE:  # a server may write anything after the status
                self._extensions[reason or ""] = extensions
        return extensions

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        # aiohttp's socket timeouts bound each connect and each read, as httpx's do.
        given = request.extensions.get("timeout", {})
        key = (given.get("connect"), given.get("read"), given.get("pool"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(sock_connect=key[0], sock_read=key[1], connect=key[2])
        return timeout


class _ReadResponse(httpx.Response):
    """A response whose body was read whole: ``content`` is ready, with nothing left to drain or decode, and its
    headers as the wire gave them (``raw_headers``, what ``raw_headers()`` reads).

    httpx would pass a body given as ``content=`` through its decoders and chunkers once more.
    """

    def __init__(
        self, status_code: int, *, headers: RawHeaders, body: bytes, request: httpx.Request, extensions: dict[str, bytes]
    ) -> None:
        # httpx.Response.__init__'s attributes, set as it would leave them for a stream (once per answer).
        self.status_code = status_code
        self.raw_headers = headers
        self._headers: httpx.Headers | None = None
        self._request = request
        self.next_request = None
        self.extensions = dict(extensions)
        self.history = []
        self.is_closed = False
        self.is_stream_consumed = False
        self.default_encoding = "utf-8"
        self.stream = httpx.ByteStream(body)
        self._num_bytes_downloaded = 0
        self._body = body

    @property
    def headers(self) -> httpx.Headers:
        # Parsed when first read: on most answers only the raw pairs are (``raw_headers``).
        if self._headers is None:
            self._headers = httpx.Headers(self.raw_headers)
        return self._headers

    @headers.setter
    def headers(self, value: httpx.Headers) -> None:
        self._headers = httpx.Headers(value)

    @property
    def content(self) -> bytes:
        return self._body

    def read(self) -> bytes:
        return self._body

    async def aread(self) -> bytes:
        return self._body

    async def aclose(self) -> None:
        self.is_closed = True


class _Streamed(httpx.AsyncByteStream):
    """A body still on the connection, read as the caller iterates."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(_STREAM_CHUNK):
                yield chunk
        except Exception as exc:
            raise _httpx_error(exc)

    async def aclose(self) -> None:
        # Back to the pool once read to the end; a body left half read closes its connection.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def raw_headers(response: httpx.Response) -> Sequence[tuple[bytes, bytes]]:
    """A response's headers as byte pairs, without parsing them when this transport's response kept them so."""
    if isinstance(response, _ReadResponse):
        return response.raw_headers
    return response.headers.raw


def _httpx_error(exc: Exception) -> Exception:
    """httpx's error for an aiohttp one, raised from it: the aiohttp error still says what happened."""
    for aiohttp_class, httpx_class in _ERRORS:
        if isinstance(exc, aiohttp_class):
            mapped = httpx_class(str(exc) or type(exc).__name__)
            mapped.__cause__ = exc
            return mapped
    return exc
