"""llm-dispatch's Prefect-free core: settings, inputs, the HTTP client and its limits, batch files."""

from __future__ import annotations

from ._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BatchCancelledError,
    BatchFailedError,
    BatchLineError,
    ConfigError,
    ConflictError,
    InputError,
    InternalServerError,
    LLMDispatchError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
    status_error_class,
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
from ._dispatch import ChatSender, DispatchOutcome, Progress, ResultSink, WorkItem, current_progress, send_all
from ._inputs import PromptSpec, fingerprint, parse_prompt_dicts, read_prompts
from ._limits import AdaptiveLimiter, RateLimiter, SharedPause
from ._pricing import PICO_PER_USD, CostTotals, PriceTable, RowCost, RowPricer, estimate_request_cost, from_pico
from ._responses import chat_result_from_body
from ._retry import DEFAULT_MAX_RETRY_AFTER, backoff_delay
from ._routing import RoutingRules, decide_route, parse_deadline, prompt_chars
from ._settings import Settings
from ._tokens import estimate_prompt_tokens, estimate_request_tokens
from ._transport import default_transport
from ._types import ChatRequest, ChatResult, dedupe_key

__all__ = [
    "BatchCancelledError",
    "BatchFailedError",
    "BatchLineError",
    "ChatSender",
    "CostTotals",
    "DispatchOutcome",
    "PICO_PER_USD",
    "PriceTable",
    "Progress",
    "PromptSpec",
    "ResultSink",
    "RoutingRules",
    "RowCost",
    "RowPricer",
    "WorkItem",
    "current_progress",
    "decide_route",
    "dedupe_key",
    "estimate_request_cost",
    "fingerprint",
    "from_pico",
    "parse_deadline",
    "parse_prompt_dicts",
    "prompt_chars",
    "read_prompts",
    "send_all",
    "status_error_class",
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
    "backoff_delay",
    "chat_result_from_body",
    "default_transport",
    "estimate_prompt_tokens",
    "estimate_request_tokens",
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
    "UnprocessableEntityError",
]
