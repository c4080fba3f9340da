"""The client's defaults, named once: the constructor, the transport and the docs all read them here."""

from __future__ import annotations

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_FILE_TIMEOUT",
    "DEFAULT_KEEPALIVE_EXPIRY",
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "RAW_BODY_CHARS",
]

# One attempt of a request whose maximum output is small or unknown: both SDKs' default (openai-python's and
# Anthropic's "10 minutes"), long enough for a reasoning model to finish; a larger cap grows it (``_deadlines``).
DEFAULT_TIMEOUT = 600.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_CONCURRENCY = 64
# aiohttp's own default; an idle connection the server has already closed costs one retried attempt.
DEFAULT_KEEPALIVE_EXPIRY = 15.0
# Per attempt, for uploads, downloads and Message Batch creates (the batch is the body, up to 256 MB): a 200 MB
# batch file over a slow link needs minutes, not seconds.
DEFAULT_FILE_TIMEOUT = 900.0
DEFAULT_LIST_LIMIT = 100  # OpenAI's largest page of batches
# How much of a 2xx body that is no answer is kept with its failure, for inspection (characters).
RAW_BODY_CHARS = 64 * 1024
