"""What each Gemini model refuses or needs sent (the Developer API's generateContent), each rule with its source."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .._params import shown
from ._model_rules import Refusal, _listed

__all__ = ["GEMINI_MAX_STOP_SEQUENCES", "gemini_25_family", "gemini_refusal", "gemini_thinking"]
#
# Gemini (the Developer API's generateContent; the body as ``_gemini.gemini_body`` makes it):
# - ``temperature`` "Values can range from [0.0, 2.0]"; ``stopSequences``: "The set of character sequences (up to
#   5)"; ``candidateCount`` [doc: ai.google.dev/api/generate-content#generationconfig]. llm-dispatch keeps one
#   answer a request (``n`` is refused with the file, ``_gemini.gemini_param_problem``).
# - Thinking: Gemini 2.5 takes ``thinkingBudget`` (-1: dynamic): 2.5 Pro 128 to 32,768 and cannot turn thinking
#   off, 2.5 Flash 0 to 24,576, 2.5 Flash-Lite 0 or 512 to 24,576 [doc: ai.google.dev/gemini-api/docs/thinking];
#   Gemini 3 and later take ``thinkingLevel``, and "You cannot use both thinking_level and the legacy
#   thinking_budget parameter in the same request. Doing so will return a 400 error" [doc:
#   ai.google.dev/gemini-api/docs/gemini-3; secondary: gemini_ex ``Gemini.Validation.ThinkingConfig``].
# - Thinking levels by model: Gemini 3.8 Flash takes LOW, MEDIUM (default) and HIGH, and "Explicitly setting
#   thinking_level to MINIMAL will return an API validation error" [doc: Google's 3.8 Flash page,
#   docs.cloud.google.com/gemini-enterprise-agent-platform/models/gemini/3-8-flash]; Gemini 4 Hydrogen and Neon take
#   LOW, MEDIUM, HIGH (default) and XHIGH [doc: their developer guides, .../models/guides/gemini-4-hydrogen,
#   gemini-4-neon]; the other Gemini 3 models MINIMAL, LOW, MEDIUM and HIGH [doc: .../models/gemini/3-5-flash-lite].
# - Gemini 3.5 Flash-Lite: "Custom values for frequency and presence penalty parameters aren't supported. Setting a
#   custom value for these parameters will throw an error", and a GenerateContent request whose last content has
#   the model role returns an error [doc: .../models/gemini/3-5-flash-lite] (its temperature, top-K and top-P are
#   ignored, not refused).
# - ``reasoning_effort`` as Gemini's OpenAI compatibility maps it: "low", "medium", and "high" ... "we map to 1K,
#   8K, and 24K thinking token budgets. If you want to disable thinking, you can set the reasoning effort to none"
#   [doc: ai.google.dev/gemini-api/docs/openai, quoted by a secondary source; the page itself was not in the index];
#   on 2.5 that is low -> a 1,024-token budget, medium -> 8,192, high -> 24,576, none -> 0 (off; not 2.5 Pro), and
#   minimal -> 1,024 (llm-dispatch's choice: the page names no minimal); on Gemini 3 and later, an effort is the thinkingLevel of that name where the model has it, and none is
#   refused (their thinking cannot be turned off: the lowest level is the least).

_GEMINI_EFFORT_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 8192, "high": 24576, "none": 0}
# Thinking levels by model prefix, first match; any other Gemini 3 or later model: _GEMINI_3_LEVELS.
_GEMINI_LEVELS = (("gemini-3.8-flash", ("low", "medium", "high")),
                  ("gemini-4-", ("low", "medium", "high", "xhigh")))
_GEMINI_3_LEVELS = ("minimal", "low", "medium", "high")
# (lowest budget other than 0, highest, whether 0 turns thinking off) by 2.5 model family.
_GEMINI_25_BUDGETS = {"pro": (128, 32768, False), "flash": (1, 24576, True), "flash-lite": (512, 24576, True)}
GEMINI_MAX_STOP_SEQUENCES = 5
_GEMINI_25 = re.compile(r"gemini-2\.5-(pro|flash-lite|flash)\b")
_NO_PENALTIES = ("gemini-3.5-flash-lite",)


def gemini_25_family(model: str) -> str | None:
    """The 2.5 family (``pro``, ``flash``, ``flash-lite``) of ``model``, or None for another model."""
    found = _GEMINI_25.match(model)
    return found.group(1) if found else None


def _gemini_levels(model: str) -> tuple[str, ...]:
    return next((levels for prefix, levels in _GEMINI_LEVELS if model.startswith(prefix)), _GEMINI_3_LEVELS)


def gemini_thinking(model: str, effort: Any) -> dict[str, Any]:
    """The ``thinkingConfig`` a ``reasoning_effort`` is on ``model``; ``ValueError`` for one it cannot be."""
    family = gemini_25_family(model)
    if family is not None:
        if not isinstance(effort, str) or effort not in _GEMINI_EFFORT_BUDGETS:
            raise ValueError(f"reasoning_effort {shown(effort)} has no Gemini 2.5 equivalent: use one of "
                             f"{', '.join(_GEMINI_EFFORT_BUDGETS)}")
        if effort == "none" and not _GEMINI_25_BUDGETS[family][2]:
            raise ValueError(f"{model} cannot turn thinking off: use reasoning_effort minimal")
        return {"thinkingBudget": _GEMINI_EFFORT_BUDGETS[effort]}
    levels = _gemini_levels(model)
    if effort == "none":
        raise ValueError(f"{model} cannot turn thinking off: use reasoning_effort {levels[0]} (the least it thinks)")
    if not isinstance(effort, str) or effort not in levels:
        raise ValueError(f"{model} takes reasoning_effort {_listed(levels, 'or')}, not {shown(effort)}")
    return {"thinkingLevel": effort.upper()}


def gemini_refusal(model: str, body: Mapping[str, Any]) -> Refusal | None:
    """The first thing generateContent refuses in ``body`` (as sent) for ``model``, or None."""
    config = body.get("generationConfig")
    config = config if isinstance(config, Mapping) else {}
    temperature = config.get("temperature")
    if isinstance(temperature, int | float) and not 0 <= temperature <= 2:
        return Refusal("params.temperature", f"Gemini's temperature runs from 0 to 2, got {temperature}",
                       "* GenerateContentRequest.generation_config.temperature: must be in [0.0, 2.0]")
    stops = config.get("stopSequences")
    if isinstance(stops, list) and len(stops) > GEMINI_MAX_STOP_SEQUENCES:
        return Refusal("params.stop", f"Gemini takes at most {GEMINI_MAX_STOP_SEQUENCES} stop sequences, got "
                       f"{len(stops)}", "* GenerateContentRequest.generation_config.stop_sequences: at most 5 "
                       "stop sequences are allowed")
    if model.startswith(_NO_PENALTIES):
        for name, field in (("presencePenalty", "presence_penalty"), ("frequencyPenalty", "frequency_penalty")):
            if config.get(name) is not None:
                return Refusal(f"params.{field}", f"{model} takes no {field}: remove it",
                               f"{name} is not supported for this model.")
        contents = body.get("contents")
        if isinstance(contents, list) and contents and isinstance(contents[-1], Mapping) and \
                contents[-1].get("role") == "model":
            return Refusal("messages", f"{model} does not continue an assistant turn: end the messages with a user "
                           "turn", "Requests whose last content has the model role are not supported for this model.")
    thinking = config.get("thinkingConfig")
    if not isinstance(thinking, Mapping):
        return None
    budget, level = thinking.get("thinkingBudget"), thinking.get("thinkingLevel")
    if budget is not None and level is not None:
        return Refusal("params.thinkingConfig", "Gemini takes thinkingLevel or thinkingBudget, not both: remove one",
                       "You cannot use both thinking_level and the legacy thinking_budget parameter in the same "
                       "request.")
    family = gemini_25_family(model)
    levels = _gemini_levels(model)
    if family is None and isinstance(level, str) and level.lower() not in levels:
        return Refusal("params.thinkingConfig", f"{model} takes thinkingLevel {_listed(levels, 'or')}, not "
                       f"{shown(level)}", f"Thinking level {level} is not supported for this model.")
    if family is not None and level is not None:
        return Refusal("params.thinkingConfig", f"{model} takes a thinkingBudget, not a thinkingLevel (Gemini 3's)",
                       "Thinking level is not supported for this model.")
    if family is None or not isinstance(budget, int) or isinstance(budget, bool) or budget == -1:
        return None
    low, high, can_stop = _GEMINI_25_BUDGETS[family]
    if budget == 0 and can_stop:
        return None
    if not low <= budget <= high:
        off = " or 0 (off)" if can_stop else " (it cannot turn thinking off)"
        return Refusal("params.thinkingConfig", f"{model} takes a thinkingBudget from {low:,} to {high:,}{off}, or -1 "
                       f"(dynamic); got {budget:,}",
                       f"The thinking budget {budget} is invalid. Please choose a value between {low} and {high}.")
    return None
