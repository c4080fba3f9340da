"""llm-dispatch's Prefect-free core: settings, inputs, the HTTP client and its limits, the simulator."""

from __future__ import annotations

from ._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConfigError,
    ConflictError,
    InputError,
    InternalServerError,
    LLMDispatchError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
)
from ._batch_files import BatchFile, BatchLine, read_batch_output, write_batch_files
from ._batch_types import (
    DEFAULT_BATCH_LIMITS,
    OPENAI_BATCH_LIMITS,
    BatchInfo,
    BatchLimits,
    BatchStatus,
    FileInfo,
    RequestCounts,
    batch_status_from_api,
)
from ._client import LLMClient
from ._constants import DEFAULT_CONCURRENCY, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ._limits import AdaptiveLimiter, RateLimiter, SharedPause
from ._responses import chat_result_from_body
from ._retry import DEFAULT_MAX_RETRY_AFTER
from ._settings import Settings
from ._simulator import Simulator, SimulatorConfig, serve as serve_simulator
from ._tokens import estimate_prompt_tokens, estimate_request_tokens
from ._transport import default_transport
from ._types import ChatRequest, ChatResult

__all__ = [
    "DEFAULT_BATCH_LIMITS",
    "OPENAI_BATCH_LIMITS",
    "BatchFile",
    "BatchInfo",
    "BatchLimits",
    "BatchLine",
    "BatchStatus",
    "FileInfo",
    "RequestCounts",
    "batch_status_from_api",
    "read_batch_output",
    "write_batch_files",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "AdaptiveLimiter",
    "LLMClient",
    "RateLimiter",
    "SharedPause",
    "chat_result_from_body",
    "default_transport",
    "estimate_prompt_tokens",
    "estimate_request_tokens",
    "serve_simulator",
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ChatRequest",
    "ChatResult",
    "ConfigError",
    "ConflictError",
    "InputError",
    "InternalServerError",
    "LLMDispatchError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "Settings",
    "Simulator",
    "SimulatorConfig",
    "UnprocessableEntityError",
]
