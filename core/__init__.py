"""llm-dispatch's Prefect-free core: settings, inputs, the HTTP client and its limits, batch files."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _exceptions, _status
from ._exceptions import *  # noqa: F403 - the error tree, listed in _exceptions.__all__
from ._status import *  # noqa: F403 - every status and route word, listed in _status.__all__
from ._lazy import lazy_names

if TYPE_CHECKING:
    from .batches._message_batch_results import read_message_batch_results
    from .batches._batch_api import Adopted, BatchApi, BatchRef, ResultFile
    from .batches._batch_backends import BACKENDS, batch_api
    from .batches._batch_files import BatchFile, BatchFileWriter, BatchLine, read_batch_output, unpack_line, write_batch_files
    from ._batch_types import (
        DEFAULT_BATCH_LIMITS,
        MESSAGE_BATCH_LIMITS,
        OPENAI_BATCH_LIMITS,
        BatchInfo,
        BatchLimits,
        FileInfo,
        RequestCounts,
    )
    from .caching._cache_rules import (
        ANTHROPIC_BATCH_WRITERS,
        ANTHROPIC_MAX_BREAKPOINTS,
        ANTHROPIC_TTLS,
        OPENAI_KEY_REQUESTS_PER_MINUTE,
        CacheRules,
        cache_rules,
    )
    from .caching._explicit import CacheLedger, CacheRecord, CachedContents, ExplicitCaches
    from .caching._plan import DEFAULT_PLAN_LATENCY_S, CachePlan, CacheTally, GroupPlan, plan_caches
    from .caching._prefixes import PrefixGroup, PrefixGroups, find_prefix_groups, prefix_key, sets_breakpoints
    from .caching._warmup import Warmth, WarmUpQueue
    from .pricing._budgets import BUDGET_PERIODS, BudgetPeriod, SpendGate, job_budget_name, period_key
    from .http._client import LLMClient
    from ._constants import DEFAULT_CONCURRENCY, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
    from .pricing._costs import (
        CostTotals,
        EstimateSums,
        RouteTotals,
        estimate_request_cost,
        storage_cost,
        worst_case_cost,
    )
    from .batches._gemini_caches import GeminiCaches
    from .wire._gemini_caches import (
        CachedContent,
        cache_display_name,
        cached_content_body,
        can_reference,
        referencing_cache,
    )
    from .wire._vectors import vector_bytes, vector_floats
    from ._endpoints import DEFAULT_ENDPOINT, ENDPOINTS, SUPPORTED_ENDPOINTS, Endpoint, batch_url, check_batch_url
    from .sending._dispatch import ChatSender, DispatchOutcome, Progress, ResultSink, WorkItem, current_progress, reask, send_all
    from ._hashes import key_hash
    from .inputs._inputs import InputCheck, PromptSource, RepeatedKeys, check_prompts, fingerprint, iter_prompts
    from ._json import dollars, json_field, json_texts, money, read_json, stored_json, to_json
    from ._params import counted
    from .rules._message_shapes import anthropic_messages_refusal, openai_messages_refusal
    from .batches._message_batches import MessageBatchApi
    from .batches._gemini_batches import GeminiBatchApi
    from .rules._model_rules import (
        THINKING_PER_ANSWER_TOKEN,
        THINKING_ROOM,
        Refusal,
        batch_metadata_problem,
        openai_refusal,
    )
    from .rules._claude_rules import anthropic_refusal
    from .rules._gemini_rules import gemini_refusal
    from .batches._openai_batches import BATCH_ID_KEY, JOB_ID_KEY, OpenAIBatchApi
    from .pricing._lanes import DEFAULT_OFFERS, Lane, LaneOffer
    from .wire._packing import (
        EMBEDDING_PACK_LIMITS,
        embedding_text,
        PackLimits,
        Packer,
        member_id,
        pack_key,
        packed_request,
        split_member_id,
    )
    from .pricing._pricing import PICO_PER_USD, Charge, ModelInfo, PriceTable, from_pico
    from ._providers import PROVIDERS, ModelRoute, Provider, ProviderTable, load_providers, provider_lookup
    from .inputs._prompt_spec import PromptSpec
    from ._retry import DEFAULT_MAX_RETRY_AFTER
    from ._run_options import (
        RUN_OPTIONS,
        Door,
        RunOption,
        door_parameters,
        flow_parameters,
        run_option,
        setting_overrides,
        shard_parameters,
    )
    from .pricing._routing import (
        RoutingRules,
        decide_route,
        format_duration,
        parse_deadline,
        prompt_chars,
    )
    from ._settings import DEFAULT_ANTHROPIC_VERSION, DEFAULT_MAX_TOKENS, Settings
    from .wire._structured import (
        AnswerCheck,
        answer_schema,
        answer_text,
        check_answer,
        checked,
        load_schema,
        pydantic_schema,
        reask_messages,
        response_format_for,
        response_format_problem,
    )
    from .http._stops import RunStop, Stopped
    from .pricing._tokens import estimate_prompt_tokens
    from .http._transport import default_transport
    from ._types import TRUNCATED_FINISH_REASONS, ChatRequest, ChatResult, dedupe_key
    from .wire._wire import check_provider_key


__all__ = [
    "lazy_names",
    "ANTHROPIC_BATCH_WRITERS",
    "ANTHROPIC_MAX_BREAKPOINTS",
    "ANTHROPIC_TTLS",
    "OPENAI_KEY_REQUESTS_PER_MINUTE",
    "CacheRules",
    "CacheLedger",
    "CacheRecord",
    "CachedContents",
    "ExplicitCaches",
    "GeminiCaches",
    "CachedContent",
    "cache_display_name",
    "cached_content_body",
    "can_reference",
    "referencing_cache",
    "storage_cost",
    "cache_rules",
    "DEFAULT_PLAN_LATENCY_S",
    "CachePlan",
    "CacheTally",
    "GroupPlan",
    "plan_caches",
    "PrefixGroup",
    "PrefixGroups",
    "find_prefix_groups",
    "prefix_key",
    "sets_breakpoints",
    "Warmth",
    "WarmUpQueue",
    "DEFAULT_ENDPOINT",
    "vector_bytes",
    "vector_floats",
    "embedding_text",
    "ENDPOINTS",
    "SUPPORTED_ENDPOINTS",
    "Endpoint",
    "batch_url",
    "check_batch_url",
    "AnswerCheck",
    "answer_schema",
    "check_answer",
    "checked",
    "load_schema",
    "pydantic_schema",
    "reask_messages",
    "response_format_for",
    "response_format_problem",
    "DEFAULT_ANTHROPIC_VERSION",
    "DEFAULT_BATCH_LIMITS",
    "EMBEDDING_PACK_LIMITS",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TIMEOUT",
    "MESSAGE_BATCH_LIMITS",
    "OPENAI_BATCH_LIMITS",
    "PROVIDERS",
    "ModelRoute",
    "Provider",
    "ProviderTable",
    "load_providers",
    "PICO_PER_USD",
    "TRUNCATED_FINISH_REASONS",
    "BUDGET_PERIODS",
    "BudgetPeriod",
    "job_budget_name",
    "period_key",
    "SpendGate",
    "anthropic_messages_refusal",
    "anthropic_refusal",
    "gemini_refusal",
    "batch_metadata_problem",
    "Adopted",
    "BACKENDS",
    "BATCH_ID_KEY",
    "BatchApi",
    "batch_api",
    "BatchRef",
    "JOB_ID_KEY",
    "GeminiBatchApi",
    "MessageBatchApi",
    "OpenAIBatchApi",
    "ResultFile",
    "RUN_OPTIONS",
    "Door",
    "RunOption",
    "door_parameters",
    "flow_parameters",
    "run_option",
    "setting_overrides",
    "shard_parameters",
    "BatchFile",
    "BatchFileWriter",
    "BatchInfo",
    "BatchLimits",
    "BatchLine",
    "check_provider_key",
    "ChatRequest",
    "ChatResult",
    "ChatSender",
    "Charge",
    "CostTotals",
    "current_progress",
    "decide_route",
    "DEFAULT_OFFERS",
    "dedupe_key",
    "default_transport",
    "DispatchOutcome",
    "estimate_prompt_tokens",
    "estimate_request_cost",
    "EstimateSums",
    "FileInfo",
    "format_duration",
    "check_prompts",
    "fingerprint",
    "iter_prompts",
    "json_field",
    "key_hash",
    "member_id",
    "split_member_id",
    "from_pico",
    "LLMClient",
    "openai_messages_refusal",
    "openai_refusal",
    "parse_deadline",
    "ModelInfo",
    "PriceTable",
    "PackLimits",
    "Packer",
    "pack_key",
    "packed_request",
    "Progress",
    "provider_lookup",
    "prompt_chars",
    "InputCheck",
    "Lane",
    "LaneOffer",
    "PromptSource",
    "PromptSpec",
    "RepeatedKeys",
    "Refusal",
    "read_batch_output",
    "read_message_batch_results",
    "RequestCounts",
    "ResultSink",
    "RoutingRules",
    "RouteTotals",
    "RunStop",
    "Stopped",
    "money",
    "counted",
    "dollars",
    "THINKING_PER_ANSWER_TOKEN",
    "THINKING_ROOM",
    "send_all",
    "Settings",
    "read_json",
    "stored_json",
    "json_texts",
    "to_json",
    "WorkItem",
    "reask",
    "answer_text",
    "worst_case_cost",
    "write_batch_files",
    "unpack_line",
    *_exceptions.__all__,
    *_status.__all__,
]

__getattr__, __dir__ = lazy_names(__name__)
