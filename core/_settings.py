"""The one settings class: read from ``LLM_DISPATCH_*`` (and ``OPENAI_*``) at the edge, passed down."""

from __future__ import annotations

import re
from typing import Any, Literal
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ._constants import DEFAULT_FILE_TIMEOUT, DEFAULT_TIMEOUT
from ._endpoints import DEFAULT_ENDPOINT, Endpoint
from ._providers import PROVIDERS
from ._status import RoutePolicy

__all__ = [
    "DEFAULT_ANTHROPIC_BASE_URL",
    "DEFAULT_ANTHROPIC_VERSION",
    "DEFAULT_BASE_URL",
    "DEFAULT_DATABASE_URL",
    "DEFAULT_GEMINI_BASE_URL",
    "DEFAULT_MAX_TOKENS",
    "AuthHeader",
    "Settings",
]

# How the key is sent: ``Authorization: Bearer`` (OpenAI and most), or an ``api-key`` header (Azure OpenAI).
AuthHeader = Literal["authorization", "api-key"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com"
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
# The host, as google-genai takes a base URL (``GOOGLE_GEMINI_BASE_URL``); the client adds the API version.
DEFAULT_GEMINI_BASE_URL = "https://generativelanguage.googleapis.com"
DEFAULT_MAX_TOKENS = 4096
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///llm_dispatch.db"


class Settings(BaseSettings):
    """Everything llm-dispatch can be told. Environment: ``LLM_DISPATCH_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="LLM_DISPATCH_", extra="ignore", populate_by_name=True)

    api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("api_key", "LLM_DISPATCH_API_KEY", "OPENAI_API_KEY")
    )
    base_url: str = Field(
        default=DEFAULT_BASE_URL, validation_alias=AliasChoices("base_url", "LLM_DISPATCH_BASE_URL", "OPENAI_BASE_URL")
    )
    # Sent as OpenAI-Organization / OpenAI-Project, as openai-python sends OPENAI_ORG_ID / OPENAI_PROJECT_ID: a key
    # that belongs to several projects bills the one named. Identifiers of the account, so kept out of logs, the
    # database and artifacts like the key (public_dict says only whether they are set).
    openai_org_id: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("openai_org_id", "LLM_DISPATCH_OPENAI_ORG_ID", "OPENAI_ORG_ID"),
    )
    openai_project_id: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("openai_project_id", "LLM_DISPATCH_OPENAI_PROJECT_ID", "OPENAI_PROJECT_ID"),
    )
    # Azure OpenAI takes the key in an ``api-key`` header instead of ``Authorization: Bearer``.
    auth_header: AuthHeader = "authorization"
    # May carry a password (Postgres): kept out of reprs; recorded only through public_dict().
    database_url: str = Field(default=DEFAULT_DATABASE_URL, repr=False)
    model: str = "gpt-6-luna"
    # A model the price catalog does not name (nor the user's price file, nor model_providers) is refused before
    # anything is sent, as a likely typo; True sends it with a warning, its cost unknown.
    allow_unknown_model: bool = Field(default=False, description="send models the price catalog does not name")
    # The endpoint of prompts that name none (``chat``, ``responses``, ``embeddings``).
    endpoint: Endpoint = Field(default=DEFAULT_ENDPOINT, description="endpoint for prompts that name none")

    # Anthropic (claude-* models, and any the user maps to it with model_providers).
    anthropic_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("LLM_DISPATCH_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
    )
    anthropic_base_url: str = Field(
        default=DEFAULT_ANTHROPIC_BASE_URL,
        validation_alias=AliasChoices("LLM_DISPATCH_ANTHROPIC_BASE_URL", "ANTHROPIC_BASE_URL"),
    )
    anthropic_version: str = Field(default=DEFAULT_ANTHROPIC_VERSION, description="the anthropic-version header")
    # Gemini (gemini-* models, and any mapped to it). The key's names are google-genai's, in its order: it takes
    # GOOGLE_API_KEY over GEMINI_API_KEY when both are set (``_api_client.get_env_api_key``).
    gemini_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("LLM_DISPATCH_GEMINI_API_KEY", "GOOGLE_API_KEY", "GEMINI_API_KEY"),
    )
    gemini_base_url: str = Field(
        default=DEFAULT_GEMINI_BASE_URL,
        validation_alias=AliasChoices("LLM_DISPATCH_GEMINI_BASE_URL", "GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"),
        description="the Gemini API's scheme and host; llm-dispatch adds /v1beta",
    )
    model_providers: dict[str, str] = Field(
        default_factory=dict,
        description="model name or fnmatch glob -> provider (openai|anthropic|gemini, or one the providers file "
                    "declares), checked before the providers file's model lists and the built-in claude-* and "
                    "gemini-* rules",
    )
    # Providers beyond the built-in three (core._providers.load_providers: TOML or JSON), and a base URL per declared
    # provider over the file's (how --simulate points each at the simulator).
    providers_file: str | None = Field(
        default=None, description="your providers file (TOML or JSON): named providers, their wires, URLs, keys' "
                                  "variables, models and prices")
    provider_base_urls: dict[str, str] = Field(
        default_factory=dict, description="declared provider -> base URL, over the providers file's")
    default_max_tokens: int = Field(
        default=DEFAULT_MAX_TOKENS, ge=1,
        description="max_tokens sent to Anthropic (which requires one) for a prompt that sets none",
    )

    concurrency: int = Field(default=64, ge=1, le=10_000, description="requests in flight per flow run")
    # Each chunk is a Prefect task run and costs ~60 ms of idle limit at its start; 1,000 keeps
    # that near 1% at 200 ms latency while the UI still shows progress chunk by chunk.
    chunk_size: int = Field(default=1000, ge=1, description="prompts per Prefect chunk task")
    chunk_concurrency: int | None = Field(
        default=None, ge=1, description="requests in flight per chunk task (default: concurrency)"
    )
    concurrency_tag: str = "llm-realtime"
    tag_limit: int | None = Field(
        default=None, ge=1,
        description="chunk tasks running at once under concurrency_tag, over all runs; created when missing",
    )
    # Names of Prefect Secret blocks holding the keys (OpenAI's, Anthropic's), read by the flows instead of the
    # environment; a named block stands for its key until a flow reads it.
    api_key_block: str | None = None
    anthropic_api_key_block: str | None = None
    gemini_api_key_block: str | None = None

    request_timeout: float = Field(
        default=DEFAULT_TIMEOUT, gt=0,
        description="seconds for one HTTP attempt; a request with a larger maximum output gets 1 h per 128,000 tokens")
    file_timeout: float = Field(
        default=DEFAULT_FILE_TIMEOUT, gt=0,
        description="seconds for one attempt of an upload, a download or a Message Batch create (at least request_timeout)")
    connect_timeout: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=5, ge=0)
    max_retry_after: float = Field(default=120.0, ge=0, description="longest Retry-After honoured, seconds")
    rpm: int | None = Field(default=None, ge=1, description="requests per minute, client side")
    tpm: int | None = Field(default=None, ge=1, description="tokens per minute, client side (estimated, then corrected)")

    dedupe: bool = Field(default=True, description="reuse a stored success for an identical request")

    # Spending caps (see storage.BudgetLease): each request's worst case is reserved before it is sent.
    budget: float | None = Field(
        default=None, ge=0, description="dollars the job may spend over its whole life, held before each request")
    budget_name: str | None = Field(
        default=None, min_length=1,
        description="a named budget (`llm-dispatch budget set`) that every run naming it shares, per day, month or in total")

    # Routing: which prompts go real-time and which to the Batch API (see llm_dispatch._routing).
    route_policy: RoutePolicy = Field(
        default="length", description="rule for prompts with no urgency or deadline"
    )
    urgent_below_chars: int = Field(default=1000, ge=0, description="length policy: shorter prompts are urgent")
    deadline_margin: float = Field(
        default=3600.0, ge=0, description="seconds a deadline must leave beyond a lane's window (the Batch API's 24 h...)"
    )

    # The Batch API.
    batch_dir: str = Field(default="llm_dispatch_batches", description="where batch input/output files are kept")
    batch_max_requests: int | None = Field(
        default=None, ge=1, description="requests per batch (default: the provider's limit, OpenAI 50,000, Anthropic 100,000)"
    )
    batch_max_bytes: int | None = Field(
        default=None, ge=1, description="bytes per batch (default: the provider's limit, OpenAI 200 MB, Anthropic 256 MB)"
    )
    batch_poll_interval: float = Field(default=60.0, gt=0, description="first wait between polls, seconds")
    batch_poll_max_interval: float = Field(default=600.0, gt=0, description="longest wait between polls, seconds")
    batch_grace: float = Field(
        default=3600.0, ge=0, description="seconds past a batch's expiry before a waiting flow gives up on it"
    )
    batch_max_submissions: int = Field(
        default=3, ge=1, description="batches a prompt may go through unanswered before it is sent real-time"
    )

    # Structured answers.
    response_schema: str | dict[str, Any] | None = Field(
        default=None, description="the job's answer schema: a JSON Schema file, module:Model (a Pydantic model), or "
                                  "from Python a JSON Schema itself")
    max_reasks: int = Field(default=2, ge=0, le=10, description="times an invalid answer is asked again")

    # Prompt caching (core.caching): LLM_DISPATCH_CACHE_PLAN=off sends every request as its file wrote it.
    cache_plan: bool = Field(default=True, description="plan the providers' prompt caches for shared prefixes")

    # Cost.
    prices_file: str | None = Field(default=None, description="your own price table, merged over the bundled one")
    # A short answer. Once the database holds 20 answers from a model, the estimate learns it from them instead.
    typical_completion_tokens: int = Field(
        default=100, ge=1,
        description="mean reply length the cost estimate assumes for a model with no stored answers, before max_tokens cuts it",
    )

    @field_validator("base_url", "anthropic_base_url", "gemini_base_url")
    @classmethod
    def _check_url(cls, value: str, info: ValidationInfo) -> str:
        if not value.startswith(("http://", "https://")):
            env = f"LLM_DISPATCH_{str(info.field_name).upper()}"
            raise ValueError(f"{info.field_name} must start with http:// or https://, got {value!r}; set {env}")
        return value.rstrip("/")

    @field_validator("model_providers")
    @classmethod
    def _check_providers(cls, value: dict[str, str]) -> dict[str, str]:
        # A declared provider's name is checked against the providers file when the run's table is made.
        for pattern, provider in value.items():
            if provider not in PROVIDERS and not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,15}", provider):
                raise ValueError(
                    f"model_providers maps {pattern!r} to {provider!r}; a provider is one of {', '.join(PROVIDERS)} "
                    "or a name the providers file declares"
                )
        return value

    @field_validator("provider_base_urls")
    @classmethod
    def _check_provider_urls(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"provider_base_urls[{name!r}] must start with http:// or https://")
        return {name: url.rstrip("/") for name, url in value.items()}

    @model_validator(mode="after")
    def _mapped_to_a_provider(self) -> Settings:
        # With no providers file, a provider is a built-in one; with one, the run's table checks the names it declares.
        if self.providers_file is None:
            for pattern, provider in self.model_providers.items():
                if provider not in PROVIDERS:
                    raise ValueError(
                        f"model_providers maps {pattern!r} to {provider!r}; a provider is one of "
                        f"{', '.join(PROVIDERS)}, or one a providers file declares (LLM_DISPATCH_PROVIDERS_FILE)")
        return self

    @model_validator(mode="after")
    def _default_chunk_concurrency(self) -> Settings:
        if self.chunk_concurrency is None:
            self.chunk_concurrency = self.concurrency
        return self

    @classmethod
    def with_overrides(cls, **overrides: Any) -> Settings:
        """Settings from the environment with the values given on top; ``None`` means not given.

        A ``SecretStr`` (how flows take the database URL, so the Prefect API shows it masked) is
        unwrapped here, at the edge, and nowhere else.
        """
        values: dict[str, Any] = {
            key: value.get_secret_value() if isinstance(value, SecretStr) and key not in _SECRET_FIELDS else value
            for key, value in overrides.items()
            if value is not None
        }
        return cls(**values)

    @property
    def per_chunk_concurrency(self) -> int:
        assert self.chunk_concurrency is not None
        return self.chunk_concurrency

    def public_dict(self) -> dict[str, object]:
        """The settings as recorded in the database and artifacts: no key, no credentials in URLs."""
        data = self.model_dump(exclude=set(_SECRET_FIELDS))
        data["database_url"] = _redact_url(self.database_url)
        data["base_url"] = _redact_url(self.base_url)
        data["anthropic_base_url"] = _redact_url(self.anthropic_base_url)
        data["api_key_set"] = self.api_key is not None
        data["anthropic_key_set"] = self.anthropic_api_key is not None
        data["gemini_base_url"] = _redact_url(self.gemini_base_url)
        data["gemini_key_set"] = self.gemini_api_key is not None
        data["provider_base_urls"] = {name: _redact_url(url) for name, url in self.provider_base_urls.items()}
        data["openai_org_id_set"] = self.openai_org_id is not None
        data["openai_project_id_set"] = self.openai_project_id is not None
        return data


# Fields that hold a key or an account's ids: kept SecretStr from the edge on, and never in public_dict().
_SECRET_FIELDS = ("api_key", "anthropic_api_key", "gemini_api_key", "openai_org_id", "openai_project_id")


def _redact_url(url: str) -> str:
    """Drop any password from a URL (``scheme://user:secret@host`` -> ``scheme://user:***@host``), and the value of
    a query parameter that may hold a credential (Google's API takes its key as ``?key=``)."""
    parts = urlsplit(url)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(_SECRET_QUERY.search(name) for name, _ in pairs):
            parts = parts._replace(query=urlencode(
                [(name, "***" if _SECRET_QUERY.search(name) else value) for name, value in pairs], safe="*"))
    if parts.password is None:
        return urlunsplit(parts)
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


_SECRET_QUERY = re.compile(r"key|token|secret|password|passwd|sig", re.IGNORECASE)
