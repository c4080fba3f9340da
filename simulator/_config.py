"""Settings of the bundled simulator (OpenAI's and Anthropic's APIs): latency, injected faults, quotas and auth."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, get_args

from llm_dispatch.core import ANTHROPIC_BATCH_WRITERS, ConfigError

__all__ = [
    "ANSWER_KINDS",
    "DEFAULT_BATCH_PROCESSING_SECONDS",
    "DEFAULT_SLOW_TOKENS_PER_SECOND",
    "DEFAULT_HANG_SECONDS",
    "DEFAULT_RETRY_AFTER",
    "FAULTS",
    "MARKERS",
    "AnswerKind",
    "Fault",
    "LatencyDist",
    "RANDOM_FAULT_FIELDS",
    "STRUCTURED_FAULTS",
    "SimulatorConfig",
]

# What a marker or the admin queue can force. The HTTP statuses answer with the API's own error body
# (OpenAI's for chat, Anthropic's for Messages; 402 is Anthropic's billing_error, 504 its timeout_error, 529 its
# "overloaded"); "insufficient_quota" is the 429 of an account out of credit (OpenAI's insufficient_quota,
# Anthropic's spend limit), with no Retry-After; "hang" never answers, "drop" closes the connection,
# "malformed" is a 200 with truncated JSON.
Fault = Literal["400", "401", "402", "403", "404", "413", "429", "500", "503", "504", "529", "insufficient_quota",
                "hang", "drop", "malformed"]
FAULTS: frozenset[str] = frozenset(get_args(Fault))
# What a marker can ask of an answer that is otherwise given (quotas, latency, stats as any answer): "refuse" a
# refusal (OpenAI's message.refusal, Anthropic's stop_reason "refusal"); "slow" a long generation that spends its
# whole cap (max_completion_tokens or max_tokens) at ``slow_tokens_per_second``; "empty_choices" a 200 with
# ``"choices": []`` (Anthropic: no content) and usage; "error200" an error body with status 200 and usage; "cut"
# a 200 whose body stops half way, the connection closed after the headers promised it whole.
# For a body with a JSON schema (OpenAI's response_format, Anthropic's output_config.format), an answer that breaks
# it: "not_json" text around the JSON, "missing_field" a required property left out, "wrong_type" a property of
# another type, "truncated_json" cut off at the cap (finish_reason "length"). A marker breaks the first answer only
# (a conversation that holds an answer already, as a re-ask does, is answered right); ``invalid_json_rate`` draws
# one of them at random for any answer (from the body's digest: the same body, the same answer).
StructuredFault = Literal["not_json", "missing_field", "wrong_type", "truncated_json"]
STRUCTURED_FAULTS: tuple[str, ...] = get_args(StructuredFault)
AnswerKind = Literal["refuse", "slow", "empty_choices", "error200", "cut", "not_json", "missing_field", "wrong_type",
                     "truncated_json"]
ANSWER_KINDS: frozenset[str] = frozenset(get_args(AnswerKind))
# What a [[sim:...]] marker in a real-time request may name.
MARKERS: frozenset[str] = FAULTS | ANSWER_KINDS

LatencyDist = Literal["fixed", "uniform", "lognormal"]
_LATENCY_DISTS: frozenset[str] = frozenset(get_args(LatencyDist))

# Config field -> the fault it injects at random; order is the order the draw is split in.
RANDOM_FAULT_FIELDS: tuple[tuple[str, str], ...] = (
    ("rate_429", "429"),
    ("rate_500", "500"),
    ("rate_503", "503"),
    ("rate_529", "529"),
    ("rate_hang", "hang"),
    ("rate_drop", "drop"),
    ("rate_malformed", "malformed"),
)

DEFAULT_RETRY_AFTER = 1.0
DEFAULT_HANG_SECONDS = 600.0
# A whole batch (validating, in_progress, finalizing) takes this long: seconds, not OpenAI's hours.
DEFAULT_BATCH_PROCESSING_SECONDS = 2.0
# A "slow" answer's pace: 16,000 tokens in 130 s, a long reasoning generation.
DEFAULT_SLOW_TOKENS_PER_SECOND = 16_000 / 130

# Durations and the like: any finite number from 0 up.
_NON_NEGATIVE_FIELDS = (
    "latency", "latency_spread", "latency_per_token", "retry_after", "hang_seconds", "batch_processing_seconds",
    "quota_window", "slow_tokens_per_second",
)
_FLOAT_FIELDS = (frozenset(_NON_NEGATIVE_FIELDS) | {name for name, _ in RANDOM_FAULT_FIELDS}
                 | {"gemini_implicit_hit_rate"})
_OPTIONAL_INT_FIELDS = frozenset({"rpm", "tpm", "cache_overflow_rpm", "batch_cache_wave"})


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulatorConfig:
    """How the simulator behaves. Every field can be patched at runtime through ``POST /_sim/config``.

    Latency of an answer is ``latency`` seconds drawn from ``latency_dist`` (``uniform``: within
    ``latency ± latency_spread``; ``lognormal``: median ``latency``, sigma ``latency_spread``), plus
    ``latency_per_token`` for each completion token. Quotas (``rpm``, ``tpm``) count over a sliding window of
    ``quota_window`` seconds (a 1 s window enforces 1/60 of each quota per second, as providers may), and every
    chat answer, errors included, carries OpenAI's ``x-ratelimit-*`` headers for the quotas set (a Messages answer
    Anthropic's ``anthropic-ratelimit-*``); both APIs draw on the same quotas. ``rate_429`` is a capacity 429, drawn
    at random whatever the load, with ``retry_after`` and no quota exhausted; ``rate_529`` is Anthropic's overloaded
    (with ``retry_after`` too), an OpenAI-shaped 529 on chat. ``api_key`` is checked in ``Authorization: Bearer``
    (or ``api-key``) on OpenAI's routes and in ``x-api-key`` on Anthropic's.
    A batch runs through its statuses in about ``batch_processing_seconds`` (see ``_batch``). ``always_fault``
    answers every real-time request with one fault (a revoked key: "401"; an account out of credit:
    "insufficient_quota"); a ``[[sim:slow]]`` answer generates at ``slow_tokens_per_second``.
    """

    latency: float = 0.0
    latency_dist: LatencyDist = "fixed"
    latency_spread: float = 0.0
    latency_per_token: float = 0.0
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_529: float = 0.0
    rate_hang: float = 0.0
    rate_drop: float = 0.0
    rate_malformed: float = 0.0
    # Of the answers to a body with a JSON schema, the share that breaks it (one of STRUCTURED_FAULTS), any lane.
    invalid_json_rate: float = 0.0
    retry_after: float = DEFAULT_RETRY_AFTER  # seconds, sent with injected 429s
    hang_seconds: float = DEFAULT_HANG_SECONDS  # then the connection is closed without an answer
    rpm: int | None = None
    tpm: int | None = None
    quota_window: float = 60.0  # seconds
    models: list[str] | None = None  # None accepts any model name
    api_key: str | None = None  # None accepts any or no credentials
    seed: int = 0
    batch_processing_seconds: float = DEFAULT_BATCH_PROCESSING_SECONDS
    slow_tokens_per_second: float = DEFAULT_SLOW_TOKENS_PER_SECOND
    # A fault every real-time request gets (an account whose key is revoked, out of credit...); None: none.
    always_fault: str | None = None
    # False: no Batch API, as vLLM or Ollama: /v1/files and /v1/batches answer 404 like any unknown URL.
    batch_api: bool = True
    # OpenAI's overflow (core ``cache_rules``): past this many requests a minute on one prefix and
    # prompt_cache_key, a request is served by a cold machine (no cached tokens). None: every request is served
    # by its prefix's machine. The guide's figure is about 15.
    cache_overflow_rpm: int | None = None
    # A Message Batch's requests are answered this many at a time: a prefix one of them writes turns warm only once
    # its wave is answered, so the rest of the wave reads nothing. Anthropic processes a batch's requests
    # concurrently; the width is the assumption the cache plan prices (``core.ANTHROPIC_BATCH_WRITERS``), no
    # documented figure. None: one at a time, each warm at once.
    batch_cache_wave: int | None = ANTHROPIC_BATCH_WRITERS
    # Gemini's implicit caching promises no saving ("no cost saving guarantee", core ``cache_rules``): the share of
    # requests whose warm prefix it serves (each drawn from the seeded RNG); 1.0: every one. Explicit caches always hit.
    gemini_implicit_hit_rate: float = 1.0

    def __post_init__(self) -> None:
        for name in _NON_NEGATIVE_FIELDS:
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"simulator {name} must be a finite number >= 0, got {value!r}")
        if self.latency_dist not in _LATENCY_DISTS:
            raise ConfigError(
                f"simulator latency_dist must be one of {sorted(_LATENCY_DISTS)}, got {self.latency_dist!r}"
            )
        for name in ("invalid_json_rate", "gemini_implicit_hit_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"simulator {name} must be between 0 and 1, got {getattr(self, name)!r}")
        total = 0.0
        for name, _ in RANDOM_FAULT_FIELDS:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"simulator {name} must be between 0 and 1, got {value!r}")
            total += value
        # One uniform draw is split between the faults, so together they cannot exceed certainty.
        if total > 1.0 + 1e-9:
            raise ConfigError(f"simulator fault rates add up to {total:g}; lower them so the sum is at most 1")
        if self.slow_tokens_per_second <= 0:
            raise ConfigError(f"simulator slow_tokens_per_second must be positive, got {self.slow_tokens_per_second!r}")
        if self.always_fault is not None and self.always_fault not in FAULTS:
            raise ConfigError(f"simulator always_fault must be one of {sorted(FAULTS)} or None, "
                              f"got {self.always_fault!r}")
        if self.quota_window <= 0:
            raise ConfigError(f"simulator quota_window must be positive, got {self.quota_window!r}")
        for name in ("rpm", "tpm", "cache_overflow_rpm", "batch_cache_wave"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"simulator {name} must be >= 1 or None (no quota), got {value!r}")
        if self.models is not None and (
            not self.models or not all(isinstance(m, str) and m for m in self.models)
        ):
            raise ConfigError("simulator models must be a non-empty list of model names, or None to accept any")

    def updated(self, changes: Mapping[str, Any]) -> SimulatorConfig:
        """A copy with ``changes`` applied, e.g. from JSON; unknown fields and wrong types raise ConfigError."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(f"unknown simulator config field(s) {unknown}; known fields are {sorted(known)}")
        return replace(self, **{name: _coerce(name, value) for name, value in changes.items()})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coerce(name: str, value: Any) -> Any:
    # JSON has one number type and bool is an int in Python, so check by hand rather than trust it.
    if name in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"simulator {name} must be a number, got {value!r}")
        return float(value)
    if name in _OPTIONAL_INT_FIELDS or name == "seed":
        if value is None and name != "seed":
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"simulator {name} must be an integer, got {value!r}")
        return value
    if name == "models":
        if value is None:
            return None
        if not isinstance(value, list):
            raise ConfigError(f"simulator models must be a list of names or null, got {value!r}")
        return list(value)
    if name in ("api_key", "latency_dist", "always_fault"):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"simulator {name} must be a string, got {value!r}")
        return value
    return value
