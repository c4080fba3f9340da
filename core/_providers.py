"""Which provider a model's prompts go to, and what a provider is.

A provider is a name, a wire (how its API speaks: ``openai``, ``anthropic`` or ``gemini``), a base URL, the
environment variable holding its key, whether it has a Batch API, and its models. The three built-in providers are
named like their wires and take their endpoints and keys from the settings; a user declares more in a providers file
(TOML or JSON, ``Settings.providers_file``; the format in ``load_providers``).

A model name resolves to one provider, the first rule that matches deciding (``ProviderTable.resolve``):

1. ``NAME/MODEL`` where NAME is a declared provider: that provider, sending ``MODEL``;
2. ``Settings.model_providers`` (``LLM_DISPATCH_MODEL_PROVIDERS``): exact names, then globs in the order given;
3. the providers file's model lists: exact names, then globs; a name two providers list is refused as ambiguous;
4. the built-in rule: ``claude-*`` to anthropic, ``gemini-*`` to gemini, anything else to openai.

A prompt of a declared provider is recorded under its qualified name (``groq/llama-3.3-70b``), so prices, costs,
batch files and answers reused from storage are never confused with another provider's model of the same name;
``upstream`` is the name sent on the wire. A built-in provider's model keeps the name it was given.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from ._exceptions import ConfigError

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["BUILTIN_MODEL_PROVIDERS", "PROVIDERS", "BatchSupport", "ModelRoute", "Provider", "ProviderTable",
           "load_providers", "provider_for", "provider_lookup", "table_of"]

# The wires a provider can speak, each also a built-in provider of that name.
PROVIDERS: tuple[str, ...] = ("openai", "anthropic", "gemini")
# Checked after the user's ``model_providers``; a model no pattern matches goes to the OpenAI-compatible endpoint.
BUILTIN_MODEL_PROVIDERS: tuple[tuple[str, str], ...] = (("claude-*", "anthropic"), ("gemini-*", "gemini"))
# The cache plan's name for a declared host of the OpenAI wire (``ProviderTable.cache_rules_of``).
_OPENAI_COMPATIBLE = "openai-compatible"
# True: it has one; False: it has none (its batch-routed prompts go real-time); "learn": try, and remember a 404.
BatchSupport = bool | Literal["learn"]

# As a model's prefix and in a 16-character column (the prompt's and the batch's provider).
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,15}")
_AUTH_HEADERS = ("authorization", "api-key")
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_PROVIDER_FIELDS = frozenset({"wire", "base_url", "key_env", "batch_api", "models", "prices", "auth_header"})


@dataclass(frozen=True, slots=True)
class Provider:
    """One provider. A built-in one (``base_url`` None) takes its endpoint and key from the settings."""

    name: str
    wire: str
    base_url: str | None = None
    # The environment variable that holds its key; None: it is sent no key (a local vLLM, say).
    key_env: str | None = None
    batch_api: BatchSupport = "learn"
    # Names and globs of the models it serves (a bare name in an input goes here when it matches).
    models: tuple[str, ...] = ()
    # Model name (as sent) -> its price entry, in the price file's model format (``core/pricing/_catalog.py``).
    prices: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    # How the key is sent: ``Authorization: Bearer`` or Azure's ``api-key`` header.
    auth_header: str = "authorization"

    @property
    def builtin(self) -> bool:
        return self.base_url is None

    def key(self) -> SecretStr | None:
        """Its key, read from ``key_env`` now (never stored, logged or shown); None when it has none."""
        if self.key_env is None:
            return None
        value = os.environ.get(self.key_env, "")
        return SecretStr(value) if value else None

    def check_key(self, *, source: str | None = None) -> None:
        """``ConfigError`` when its key's variable is named but not set (a local server, the simulator, goes
        without); said before anything is sent."""
        if self.builtin or self.key_env is None or self.key() is not None:
            return
        if (urlsplit(self.base_url or "").hostname or "") in _LOCAL_HOSTS:
            return
        named = f"the providers file {source}" if source else "the providers file"
        raise ConfigError(f"no API key for provider {self.name} ({self.shown_url()}): set {self.key_env}, which "
                          f"{named} names for it, or add --simulate to use the bundled simulator")

    def shown_url(self) -> str:
        """Its base URL with any credentials and query left out: what messages and the database may hold."""
        return _redacted(self.base_url or "")


class ModelRoute(NamedTuple):
    """Where one model name goes: its provider, that provider's wire, the name it is recorded under, and the name
    sent on the wire."""

    provider: str
    wire: str
    model: str
    upstream: str


BUILTIN_PROVIDERS: Mapping[str, Provider] = MappingProxyType({name: Provider(name=name, wire=name)
                                                              for name in PROVIDERS})


class ProviderTable:
    """The built-in providers and the declared ones, and the rule that sends each model to one of them
    (``resolve``, found once per model)."""

    def __init__(self, *, declared: Iterable[Provider] = (), model_providers: Mapping[str, str] | None = None,
                 source: str | None = None) -> None:
        self.declared: dict[str, Provider] = {}
        for provider in declared:
            self.declared[provider.name] = provider
        self.source = source
        self.model_providers = dict(model_providers or {})
        for pattern, name in self.model_providers.items():
            if name not in PROVIDERS and name not in self.declared:
                raise ConfigError(
                    f"LLM_DISPATCH_MODEL_PROVIDERS maps {pattern!r} to {name!r}, which is no provider: use one of "
                    f"{', '.join([*PROVIDERS, *self.declared])} (declare others in a providers file, "
                    "LLM_DISPATCH_PROVIDERS_FILE)")
        self._exact: dict[str, list[str]] = {}
        self._globs: list[tuple[str, str]] = []
        for provider in self.declared.values():
            for pattern in provider.models:
                if any(char in pattern for char in "*?["):
                    self._globs.append((pattern, provider.name))
                else:
                    self._exact.setdefault(pattern, []).append(provider.name)
        self._routes: dict[str, ModelRoute | str] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> ProviderTable:
        """The table a run uses: ``settings.providers_file`` (with ``settings.provider_base_urls`` over its base
        URLs) and ``settings.model_providers``. Raises ``ConfigError`` for a file that cannot be used."""
        declared = load_providers(Path(settings.providers_file)) if settings.providers_file else ()
        urls = dict(settings.provider_base_urls)
        unknown = sorted(set(urls) - {provider.name for provider in declared})
        if unknown:
            raise ConfigError(f"LLM_DISPATCH_PROVIDER_BASE_URLS names {unknown[0]!r}, which the providers file does "
                              "not declare; declare it there or remove it")
        declared = tuple(provider if provider.name not in urls else _with_url(provider, urls[provider.name])
                         for provider in declared)
        return cls(declared=declared, model_providers=settings.model_providers, source=settings.providers_file)

    def __repr__(self) -> str:
        declared = ", ".join(f"{p.name}={p.wire}@{p.shown_url()}" for p in self.declared.values())
        return f"ProviderTable(declared=[{declared}], model_providers={self.model_providers!r})"

    def __contains__(self, name: object) -> bool:
        return name in PROVIDERS or name in self.declared

    def get(self, name: str) -> Provider:
        provider = self.declared.get(name) or BUILTIN_PROVIDERS.get(name)
        if provider is None:
            raise ValueError(f"provider {name!r} is not declared here (known: {', '.join(self.names)}): give the "
                             "providers file that declares it (--providers-file, LLM_DISPATCH_PROVIDERS_FILE)")
        return provider

    @property
    def names(self) -> tuple[str, ...]:
        return (*PROVIDERS, *self.declared)

    def wire(self, name: str) -> str:
        return self.get(name).wire

    def resolve(self, model: str) -> ModelRoute:
        """Where ``model`` goes (the rules in this module's docstring); ``ValueError`` for a name two declared
        providers list, saying how to name each."""
        found = self._routes.get(model)
        if found is None:
            found = self._routes[model] = self._find(model)
        if isinstance(found, str):
            raise ValueError(found)
        return found

    def provider_of(self, model: str) -> str:
        """The name of ``model``'s provider (``resolve``)."""
        return self.resolve(model).provider

    def cache_rules_of(self, model: str) -> str:
        """Whose caching rules ``model``'s requests meet (the cache plan's provider): its wire's, for a built-in
        provider or a declared one of the Anthropic or Gemini wire; ``openai-compatible`` for a declared host of the
        OpenAI wire, whose caching (if any) OpenAI's guide does not describe."""
        route = self.resolve(model)
        if route.wire == "openai" and not self.get(route.provider).builtin:
            return _OPENAI_COMPATIBLE
        return route.wire

    def declared_model(self, model: str) -> bool:
        """Whether the user named ``model``'s provider for it (a declared provider, or ``model_providers``): such a
        model is theirs, sent though the price catalog does not name it."""
        route = self.resolve(model)
        return route.provider in self.declared or _first_match(model, self.model_providers) is not None

    def _find(self, model: str) -> ModelRoute | str:
        name, slash, rest = model.partition("/")
        if slash and rest and name in self.declared:
            return self._route(name, rest)
        mapped = _first_match(model, self.model_providers)
        if mapped is not None:
            return self._route(mapped, model)
        listed = self._exact.get(model) or sorted({name for pattern, name in self._globs if fnmatchcase(model, pattern)})
        if len(listed) > 1:
            return (f"{model} is served by {' and '.join(listed)} (the providers file lists it for each): name one, "
                    f"e.g. {listed[0]}/{model}")
        if listed:
            return self._route(listed[0], model)
        for pattern, builtin in BUILTIN_MODEL_PROVIDERS:
            if fnmatchcase(model, pattern):
                return ModelRoute(builtin, builtin, model, model)
        return ModelRoute("openai", "openai", model, model)

    def _route(self, name: str, upstream: str) -> ModelRoute:
        provider = self.get(name)
        recorded = upstream if provider.builtin else f"{name}/{upstream}"
        return ModelRoute(name, provider.wire, recorded, upstream)


def table_of(providers: Mapping[str, str] | ProviderTable | None) -> ProviderTable:
    """``providers`` as a table: itself, or the built-in providers with a ``model_providers`` mapping."""
    return providers if isinstance(providers, ProviderTable) else ProviderTable(model_providers=providers)


def provider_for(model: str, *, settings: Settings) -> str:
    """The provider of ``model`` under ``settings`` (``ProviderTable.resolve``)."""
    return ProviderTable.from_settings(settings).provider_of(model)


def provider_lookup(providers: Mapping[str, str] | ProviderTable | None = None) -> Callable[[str], str]:
    """The provider of each model under one table (or a ``model_providers`` mapping), each model matched once: for a
    pass over millions of prompts. An ambiguous name, which the input check refuses, goes to no declared provider."""
    table = table_of(providers)

    def lookup(model: str) -> str:
        try:
            return table.provider_of(model)
        except ValueError:
            return "openai"

    return lookup


def load_providers(path: Path) -> tuple[Provider, ...]:
    """The providers a file declares: TOML (``.toml``) or JSON, a table ``providers`` of name -> provider::

        [providers.groq]
        wire = "openai"                              # openai | anthropic | gemini
        base_url = "https://api.groq.com/openai/v1"  # as that wire's base URL setting takes it
        key_env = "GROQ_API_KEY"                     # optional: no key sent without it
        batch_api = true                             # true | false | "learn" (the default)
        models = ["llama-3.3-70b-versatile", "qwen/*"]
        auth_header = "authorization"                # or "api-key" (Azure OpenAI)
        [providers.groq.prices."llama-3.3-70b-versatile"]
        input = 0.59                                 # per 1M tokens, as a price file's model entry
        output = 0.79

    Raises ``ConfigError`` naming the file and the field."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"providers file {where}: no such file; give the path of a TOML or JSON providers file "
                          "(LLM_DISPATCH_PROVIDERS_FILE, --providers-file)") from exc
    except OSError as exc:
        raise ConfigError(f"providers file {where}: cannot be read ({exc.strerror or exc})") from exc
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"providers file {where}: not UTF-8 text ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"providers file {where}: invalid JSON ({exc.msg} at line {exc.lineno}, column "
                          f"{exc.colno})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"providers file {where}: invalid TOML ({exc}); a .json file is read as JSON") from exc

    def bad(field_name: str, problem: str) -> ConfigError:
        return ConfigError(f"providers file {where}: field '{field_name}' {problem}")

    if not isinstance(data, dict) or set(data) != {"providers"} or not isinstance(data["providers"], dict):
        raise ConfigError(f"providers file {where}: expected one table 'providers' of name -> provider "
                          "([providers.NAME] in TOML, {\"providers\": {NAME: {...}}} in JSON)")
    return tuple(_provider(name, entry, bad=bad) for name, entry in data["providers"].items())


def _provider(name: str, entry: Any, *, bad: Callable[[str, str], ConfigError]) -> Provider:
    at = f"providers.{name}"
    if not _NAME.fullmatch(name):
        raise bad(at, "must be a name of lower-case letters, digits, '-' and '_' (up to 16), as a model's "
                      "prefix takes it (NAME/model)")
    if name in PROVIDERS:
        raise bad(at, f"is a built-in provider: set its base URL and key with its settings (LLM_DISPATCH_"
                      f"{'' if name == 'openai' else name.upper() + '_'}BASE_URL), or give yours another name")
    if not isinstance(entry, dict):
        raise bad(at, "must be a table: wire, base_url, key_env, batch_api, models, prices")
    unknown = sorted(set(entry) - _PROVIDER_FIELDS)
    if unknown:
        raise bad(f"{at}.{unknown[0]}", f"is unknown (allowed: {', '.join(sorted(_PROVIDER_FIELDS))})")
    for required in ("wire", "base_url"):
        if required not in entry:
            raise bad(f"{at}.{required}", "is missing")
    wire = entry["wire"]
    if wire not in PROVIDERS:
        raise bad(f"{at}.wire", f"must be one of {', '.join(PROVIDERS)}, got {wire!r}")
    url = entry["base_url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise bad(f"{at}.base_url", f"must start with http:// or https://, got {_redacted(str(url))!r}")
    key_env = entry.get("key_env")
    if key_env is not None and (not isinstance(key_env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env)):
        raise bad(f"{at}.key_env", "must be the name of an environment variable (the key itself never goes in "
                                   "this file)")
    batch = entry.get("batch_api", "learn")
    if batch not in (True, False, "learn"):
        raise bad(f"{at}.batch_api", f"must be true, false or \"learn\", got {batch!r}")
    models = entry.get("models", [])
    if not isinstance(models, list) or not all(isinstance(model, str) and model.strip() for model in models):
        raise bad(f"{at}.models", "must be a list of model names or globs")
    prices = entry.get("prices", {})
    if not isinstance(prices, dict) or not all(isinstance(value, dict) for value in prices.values()):
        raise bad(f"{at}.prices", "must be a table of model name -> {input, output, ...} (per 1M tokens)")
    auth = entry.get("auth_header", "authorization")
    if auth not in _AUTH_HEADERS or (auth == "api-key" and wire != "openai"):
        raise bad(f"{at}.auth_header", f"must be 'authorization' or 'api-key' (the openai wire only), got {auth!r}")
    return Provider(name=name, wire=wire, base_url=url.rstrip("/"), key_env=key_env, batch_api=batch,
                    models=tuple(model.strip() for model in models), prices=MappingProxyType(dict(prices)),
                    auth_header=auth)


def _with_url(provider: Provider, url: str) -> Provider:
    return Provider(name=provider.name, wire=provider.wire, base_url=url.rstrip("/"), key_env=provider.key_env,
                    batch_api=provider.batch_api, models=provider.models, prices=provider.prices,
                    auth_header=provider.auth_header)


def _first_match(model: str, mapping: Mapping[str, str]) -> str | None:
    exact = mapping.get(model)
    if exact is not None:
        return exact
    for pattern, name in mapping.items():
        if fnmatchcase(model, pattern):
            return name
    return None


def _redacted(url: str) -> str:
    """``url`` with no user, password or query: how a base URL is shown."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
