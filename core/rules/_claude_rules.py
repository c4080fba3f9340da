"""What each Claude model refuses or needs sent, each rule with its source (the sources: ``_model_rules``' docstring)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from .._params import shown
from ._model_rules import ANTHROPIC_SAMPLING_REMOVED_IN, ANTHROPIC_SERVICE_TIERS, Refusal

__all__ = ["anthropic_max_tokens", "anthropic_output_format", "anthropic_refusal", "anthropic_thinks"]

_CLAUDE = re.compile(r"claude-(opus|sonnet|haiku|fable|mythos)-(\d+)(?:-(\d))?(?:-\d{8})?")
_MYTHOS_PREVIEW = "claude-mythos-preview"
# (tier, version) of the documented models; a version is (major, minor).
_FIXED_SAMPLING = frozenset({
    ("opus", (4, 7)), ("opus", (4, 8)), ("opus", (5, 0)), ("opus", (5, 5)), ("sonnet", (5, 0)), ("sonnet", (5, 5)),
    ("haiku", (5, 5)), ("fable", (5, 0)), ("fable", (5, 1)), ("mythos", (5, 0)), ("mythos", (5, 1)),
})
_ONE_OF_TEMPERATURE_TOP_P = _FIXED_SAMPLING | {
    ("haiku", (4, 5)), ("sonnet", (4, 5)), ("opus", (4, 5)), ("sonnet", (4, 6)), ("opus", (4, 6)),
}
_NO_FORCED_TOOLS = frozenset({("fable", (5, 1)), ("mythos", (5, 1)), ("opus", (5, 5)), ("sonnet", (5, 5))})
_THINKS_BY_DEFAULT = frozenset({
    ("fable", (5, 0)), ("fable", (5, 1)), ("fable", (5, 2)), ("mythos", (5, 0)), ("mythos", (5, 1)),
    ("mythos", (5, 2)), ("opus", (5, 0)), ("opus", (5, 5)), ("sonnet", (5, 0)), ("sonnet", (5, 5)), ("haiku", (5, 5)),
})
_NO_THINKING_DISABLED = frozenset({("fable", (5, 0)), ("fable", (5, 1)), ("mythos", (5, 0)), ("mythos", (5, 1)),
                                   ("opus", (5, 5)), ("sonnet", (5, 5))})
_BETWEEN_TOOLS = frozenset({("sonnet", (5, 5))})
_NO_EFFORT = frozenset({("haiku", (4, 5)), ("sonnet", (4, 5))})
_FORCED = frozenset({"any", "tool"})
_FORCED_API = 'tool_choice: type "tool" and "any" are not supported for this model.'


@functools.lru_cache(maxsize=256)
def _claude(model: str) -> tuple[str, tuple[int, int]] | None:
    """(tier, (major, minor)) of a Claude model name, or None for a name this module does not know."""
    if model == _MYTHOS_PREVIEW:
        return ("mythos", (0, 0))
    match = _CLAUDE.fullmatch(model)
    if match is None:
        return None
    tier, major, minor = match.groups()
    return tier, (int(major), int(minor or 0))


_OUTPUT_FORMAT_FROM = (4, 5)


def anthropic_output_format(model: str) -> bool:
    """Whether ``model`` takes a JSON schema as ``output_config.format`` (else as a forced tool): Claude 4.5 and
    later, and any name this module does not know (a newer model)."""
    claude = _claude(model)
    return claude is None or claude[0] in ("fable", "mythos") or claude[1] >= _OUTPUT_FORMAT_FROM


def anthropic_thinks(model: str, params: Mapping[str, Any]) -> bool:
    """Whether a request to ``model`` with these (OpenAI-style or Anthropic) params thinks before it answers."""
    thinking = params.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    if kind in ("enabled", "adaptive"):
        return True
    if kind in ("disabled", "between_tools"):
        return False
    return _claude(model) in _THINKS_BY_DEFAULT


def anthropic_max_tokens(model: str, params: Mapping[str, Any], *, default: int, thinking_default: int) -> int:
    """The max_tokens sent to ``model`` for a request that sets none: ``default``, or ``thinking_default`` when it
    thinks (and at least room for the answer past a ``budget_tokens``, which must be below max_tokens)."""
    if not anthropic_thinks(model, params):
        return default
    thinking = params.get("thinking")
    budget = thinking.get("budget_tokens") if isinstance(thinking, Mapping) else None
    if isinstance(budget, int) and not isinstance(budget, bool):
        return max(thinking_default, budget + default)
    return thinking_default


def anthropic_refusal(body: Mapping[str, Any], *, version: str) -> Refusal | None:
    """The first thing the Messages API refuses in ``body`` (as sent, after the translation) for its model under
    ``anthropic-version: version``, or None. Messages are checked by ``anthropic_messages_refusal``."""
    model = str(body.get("model"))
    removed = version >= ANTHROPIC_SAMPLING_REMOVED_IN
    for name in ("temperature", "top_p", "top_k"):
        if removed and name in body:
            return Refusal(f"params.{name}",
                           f"anthropic-version {version} takes no {name} for any model: remove it (or set "
                           "LLM_DISPATCH_ANTHROPIC_VERSION=2023-06-01, where older models still take it)",
                           f"{name}: Extra inputs are not permitted")
    tier = body.get("service_tier")
    if tier is not None and tier not in ANTHROPIC_SERVICE_TIERS:
        return Refusal("params.service_tier",
                       f"Anthropic's service_tier is 'auto' or 'standard_only', not {shown(tier)} (flex, priority and "
                       "fast are OpenAI's): remove it for claude models",
                       "service_tier: Input should be 'auto' or 'standard_only'")
    claude = _claude(model)
    if claude is None:
        return None
    temperature, top_p = body.get("temperature"), body.get("top_p")
    if claude in _FIXED_SAMPLING:
        for name, default in (("temperature", 1), ("top_p", None), ("top_k", None)):
            value = body.get(name)
            if value is not None and value != default:
                return Refusal(f"params.{name}", f"{model} takes no {name} (its sampling is fixed): remove it",
                               f"{name}: setting sampling parameters to non-default values is not supported for "
                               "this model.")
    if claude in _ONE_OF_TEMPERATURE_TOP_P and temperature is not None and top_p is not None:
        return Refusal("params.top_p", f"{model} takes temperature or top_p, not both: remove one",
                       "temperature and top_p cannot both be specified for this model. Please use only one.")
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    problem = _thinking_refusal(model, claude, kind)
    if problem is not None:
        return problem
    if kind == "enabled":
        if temperature is not None and temperature != 1 or body.get("top_k") is not None:
            name = "temperature" if temperature is not None and temperature != 1 else "top_k"
            return Refusal(f"params.{name}", f"{model} with extended thinking takes no {name}: remove it",
                           f"{name} may not be set when thinking is enabled")
        if top_p is not None and not 0.95 <= top_p <= 1:
            return Refusal("params.top_p", f"{model} with extended thinking takes top_p from 0.95 to 1 only",
                           "top_p must be between 0.95 and 1 when thinking is enabled")
    choice = body.get("tool_choice")
    forced = isinstance(choice, Mapping) and choice.get("type") in _FORCED
    if forced and (claude in _NO_FORCED_TOOLS or kind == "enabled"):
        why = "refuses forced tool use" if claude in _NO_FORCED_TOOLS else "refuses forced tool use with thinking on"
        return Refusal("params.tool_choice",
                       f"{model} {why} (tool_choice 'required', 'any' or a named tool): use 'auto' with the tool "
                       "marked strict, or output_config.format", _FORCED_API)
    output_config = body.get("output_config")
    if isinstance(output_config, Mapping) and output_config.get("effort") is not None and claude in _NO_EFFORT:
        return Refusal("params.output_config", f"{model} takes no output_config.effort: remove it",
                       "output_config.effort: effort is not supported for this model.")
    return None


def _thinking_refusal(model: str, claude: tuple[str, tuple[int, int]], kind: Any) -> Refusal | None:
    if kind is None:
        return None
    api = f'"thinking.type.{kind}" is not supported for this model.'
    tier, version = claude
    if kind == "enabled" and version >= (4, 7):
        return Refusal("params.thinking", f"{model} takes no extended thinking (type 'enabled'): use "
                       "{'type': 'adaptive'} with output_config.effort", api)
    if kind == "adaptive" and version <= (4, 5) and tier != "mythos":
        return Refusal("params.thinking", f"{model} takes only extended thinking: use {{'type': 'enabled', "
                       "'budget_tokens': N}", api)
    if kind == "disabled" and claude in _NO_THINKING_DISABLED:
        instead = "use {'type': 'between_tools'}" if claude in _BETWEEN_TOOLS else "remove thinking (it always thinks)"
        return Refusal("params.thinking", f"{model} cannot turn thinking off: {instead}", api)
    if kind == "between_tools" and claude not in _BETWEEN_TOOLS:
        return Refusal("params.thinking", f"{model} takes no thinking type 'between_tools' (only Sonnet 5.5 does)",
                       api)
    return None


