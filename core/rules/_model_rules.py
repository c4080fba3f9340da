"""What each model family accepts, from its provider's documentation: the one home of every per-model request rule.

The input check refuses with the file what a model would refuse with a 400 (``openai_refusal``,
``anthropic_refusal``), the request builders send what a model needs (``openai_body``: ``max_tokens`` as
``max_completion_tokens`` to OpenAI's reasoning models; ``anthropic_max_tokens``: room for thinking), and the
simulator answers the same 400s in each provider's words (``Refusal.api_message``).

A rule is here only when a source says so; each family cites it. [doc] is the provider's own page or SDK (types
generated from its OpenAPI spec); [observed] is a 400 body quoted in a public issue; [secondary] is a third party.
A model no rule names is sent as given: the provider decides, and its 400 is stored with the prompt.

OpenAI (chat completions):
- ``max_tokens`` "is not compatible with o-series models", deprecated for ``max_completion_tokens`` [doc:
  openai-python ``completion_create_params.py``]; refused by gpt-5, 5.1, 5.2, 5.4 with "Unsupported parameter:
  'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead." [observed]. openai-python
  itself does not rename it (LiteLLM does): llm-dispatch renames it for the reasoning families below.
- temperature, top_p, logprobs, top_logprobs: "only supported when using GPT-5.2 with reasoning effort set to
  none ... older GPT-5 models (gpt-5, gpt-5-mini, gpt-5-nano) that include these fields will raise an error"
  [doc: developers.openai.com/api/docs/guides/latest-model, quoted]; "When reasoning effort is not none, remove
  temperature, top_p, and top_logprobs; also remove logprobs" [doc: guides/deployment-checklist]. So they depend
  on the effort the request runs at: its ``reasoning_effort``, else the model's default.
- Defaults: "gpt-5.1 defaults to none ... All models before gpt-5.1 default to medium ... and do not support
  none. The gpt-5-pro model defaults to (and only supports) high" [doc: openai-python ``reasoning_effort``
  docstring until 2026-07-09]; gpt-5.5 and 5.6 default to medium [doc: guides/reasoning; 5.6 guide, quoted];
  gpt-5.2 and 5.4 to none [secondary]; no GPT-6 model to none [secondary].
- ``stop``: "Not supported with latest reasoning models o3 and o4-mini" [doc: SDK]; gpt-5 refuses it [observed].
- Function tools with an effort other than none: "Function tools with reasoning_effort are not supported for
  gpt-5.6-luna in /v1/chat/completions. To use function tools, use /v1/responses or set reasoning_effort to
  'none'." [observed: gpt-5.2, 5.4 (openai/openai-openapi#541), 5.5, 5.6-sol/terra/luna]; "GPT-6 Sol and GPT-6
  Luna support function calling in Chat Completions only with reasoning_effort: "none"", "GPT-6 Astra and GPT-6.1
  Sol require Responses for tool calling" [doc: deployment checklist]. gpt-5.1: "Tool calls are supported for all
  reasoning values" [doc: SDK].
- ``reasoning_effort`` on a model that does not reason: "Unrecognized request argument supplied:
  reasoning_effort" [observed: gpt-4o-mini].
- Room for thinking: reasoning tokens count against ``max_completion_tokens`` ("you can limit the total number of
  tokens the model generates (including both reasoning and final output tokens)" [doc: OpenAI's reasoning guide,
  platform.openai.com/docs/guides/reasoning, quoted on community.openai.com/t/1285430]); a request that reaches it
  while still reasoning ends with no visible answer; the guide's "Allocating space for reasoning" recommends
  reserving at least 25,000 tokens for reasoning and outputs when starting out [doc, the figure read through a
  secondary paraphrase: vstorm-co.github.io/pydantic-ai-examples/examples/reasoning-effort]. ``thinking_room``
  warns far lower, where an ordinary answer cannot fit at all (see ``THINKING_ROOM``).

Anthropic (Messages API; see ``anthropic_refusal`` for the API versions):
- ``anthropic-version: 2026-10-21``: "The temperature, top_p, and top_k request parameters are removed. A request
  that sends any of them returns a 400" [doc: platform.claude.com/docs/en/api/versioning]; a document block in an
  assistant turn, or a user text block with citations, is a 400 [doc: api/migration-2026-10-21].
- Under 2023-06-01: Opus 4.7, 4.8, 5, 5.5, Sonnet 5, 5.5, Haiku 5.5, Fable 5, 5.1, Mythos 5, 5.1 and Mythos
  Preview refuse non-default temperature, top_p or top_k [doc: Sonnet 5 overview, Haiku 5.5 what's new;
  the list: secondary paraphrase of the thinking page]; "Use only temperature OR top_p, not both. Setting both
  returns a 400 error on Claude Haiku 4.5" [doc: Haiku 4.5 migration guide], also Sonnet 4.5 [observed] and the
  other 4.5/4.6 models [secondary]; with extended thinking on, temperature and top_k may not be changed and
  top_p must be 0.95-1 [secondary, quoting the thinking page].
- Forced tool use (``tool_choice`` any or tool; our ``"required"`` and named functions): "tool_choice: type "tool"
  and "any" are not supported for this model." on Fable 5.1 / Mythos 5.1 [doc mirror], Opus 5.5 and Sonnet 5.5
  [doc]; Opus 5, Sonnet 5, Fable 5 accept it; Haiku 5.5 and Fable 5.2 say nothing (sent as given). With extended
  thinking (``thinking.type: enabled``) it is refused on every model [secondary, quoting the thinking page].
- ``thinking``: "Claude 4.7 and later models do not support [enabled] and reject requests that use it"; 4.5 and
  earlier take only enabled; Fable 5/5.1, Mythos 5/5.1, Opus 5.5 and Sonnet 5.5 refuse disabled; "Only Claude
  Sonnet 5.5 accepts between_tools" [doc: build-with-claude/thinking-troubleshooting, and the models' pages].
  Fable 5.x, Mythos 5.x, Opus 5, 5.5, Sonnet 5, 5.5 and Haiku 5.5 think when ``thinking`` is not given, and
  "thinking tokens also count toward [max_tokens]" [doc: thinking; Haiku 5.5 what's new].
- ``output_config.effort`` is "not supported on Haiku 4.5 or Sonnet 4.5" [doc: build-with-claude/effort].
- Structured outputs (``output_config.format: {type: "json_schema", schema}``) are "generally available ... for
  Claude Opus 4.6, Claude Sonnet 4.6, Claude Sonnet 4.5, Claude Opus 4.5, and Claude Haiku 4.5" and the later
  models [doc: platform.claude.com/docs/en/build-with-claude/structured-outputs, read through a mirror]; older
  models get the schema as a forced tool (``anthropic_output_format``), refused where forced tools are.
- ``service_tier``: "auto" or "standard_only" only [doc: api/service-tiers; SDK ``message_create_params``].
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._params import MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE, shown, shown_json
from .._types import ChatRequest

__all__ = [
    "ANTHROPIC_SAMPLING_REMOVED_IN",
    "ANTHROPIC_SERVICE_TIERS",
    "DEFAULT_THINKING_MAX_TOKENS",
    "OPENAI_BATCH_METADATA_KEYS",
    "Refusal",
    "batch_metadata_problem",
    "is_openai_model",
    "openai_body",
    "openai_params",
    "openai_refusal",
    "THINKING_PER_ANSWER_TOKEN",
    "THINKING_ROOM",
    "thinking_room",
]

# The anthropic-version from which temperature, top_p and top_k are refused on every model.
ANTHROPIC_SAMPLING_REMOVED_IN = "2026-10-21"
ANTHROPIC_SERVICE_TIERS = frozenset({"auto", "standard_only"})
# max_tokens for a Claude request that thinks and sets none: thinking counts against it, so the 4,096 default can
# end an answer before its text. The largest round figure under the point where the Anthropic SDK refuses a
# non-streaming request as too long (3,600 s * max_tokens / 128,000 > 600 s, i.e. 21,334 tokens).
DEFAULT_THINKING_MAX_TOKENS = 16_000
# OpenAI's batch metadata is a request's: "Set of 16 key-value pairs ... Keys ... maximum length of 64 characters.
# Values ... maximum length of 512" (openai-python ``batch_create_params.py``); llm-dispatch adds two of its own.
OPENAI_BATCH_METADATA_KEYS = MAX_METADATA_PAIRS
# A reasoning model's thinking, counted as tokens of thinking per token of visible answer at any effort but 'none':
# a working figure (OpenAI documents no ratio, only that thinking counts against the cap), the one the simulator
# thinks by, so its truncations are the ones ``thinking_room`` warns of.
THINKING_PER_ANSWER_TOKEN = 3
# The reply cap below which a reasoning request is warned: an answer of 300 tokens (a few paragraphs, the
# simulator's longest unprompted one) and its thinking. Well under OpenAI's 25,000 (a starting reserve, not a
# floor): a warning here means answers are likely to be cut, not that the cap is merely tight.
THINKING_ROOM = (1 + THINKING_PER_ANSWER_TOKEN) * 300


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request its provider answers with a 400: what to tell the user, and the provider's own answer."""

    # Where in the prompt, as the input check names it ("params.temperature").
    field: str
    # One line for the user: the model, what it refuses, what to do instead.
    message: str
    # The 400's message in the provider's words (what the simulator answers), and OpenAI's ``param`` and ``code``.
    api_message: str
    api_param: str | None = None
    api_code: str | None = None


# ----------------------------------------------------------------------------------------------------- OpenAI

Tools = Literal["any", "effort-none", "responses-only"]
_ALL_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SAMPLING = ("temperature", "top_p", "logprobs", "top_logprobs")


@dataclass(frozen=True, slots=True)
class _OpenAIFamily:
    name: str
    reasoning: bool = True
    # The reasoning_effort values it takes, where documented; None: not documented (any is sent).
    efforts: tuple[str, ...] | None = None
    # Documented to refuse "none" (its full list unknown).
    refuses_none: bool = False
    # The effort it runs at when the request gives none; None: not documented.
    default_effort: str | None = None
    takes_stop: bool = True
    tools: Tools = "any"

    @property
    def has_none(self) -> bool | None:
        if self.refuses_none:
            return False
        return None if self.efforts is None else "none" in self.efforts


_O_SERIES = ("low", "medium", "high")
_GPT5 = ("minimal", "low", "medium", "high")
_GPT51 = ("none", "low", "medium", "high")
_GPT52 = ("none", "low", "medium", "high", "xhigh")
_PRO = ("medium", "high", "xhigh")
_NONE_TO_MAX = ("none", "low", "medium", "high", "xhigh", "max")
_LOW_TO_MAX = ("low", "medium", "high", "xhigh", "max")

# First match wins; a dated snapshot (-2025-08-07) and a fine-tune (ft:BASE:...) go by their base name.
_OPENAI_FAMILIES: tuple[tuple[str, _OpenAIFamily], ...] = (
    (r"o1(-mini|-preview|-pro)?", _OpenAIFamily("o1", efforts=_O_SERIES, default_effort="medium")),
    (r"o3(-mini|-pro|-deep-research)?|o4-mini(-deep-research)?",
     _OpenAIFamily("o3/o4-mini", efforts=_O_SERIES, default_effort="medium", takes_stop=False)),
    (r"gpt-5(-mini|-nano)?", _OpenAIFamily("gpt-5", efforts=_GPT5, default_effort="medium", takes_stop=False)),
    (r"gpt-5-pro", _OpenAIFamily("gpt-5-pro", efforts=("high",), default_effort="high")),
    (r"gpt-5\.1", _OpenAIFamily("gpt-5.1", efforts=_GPT51, default_effort="none")),
    (r"gpt-5\.2", _OpenAIFamily("gpt-5.2", efforts=_GPT52, default_effort="none", tools="effort-none")),
    (r"gpt-5\.(2|4)-pro", _OpenAIFamily("gpt-5.x-pro", efforts=_PRO)),
    (r"gpt-5\.4", _OpenAIFamily("gpt-5.4", efforts=_GPT52, default_effort="none", tools="effort-none")),
    (r"gpt-5\.5", _OpenAIFamily("gpt-5.5", default_effort="medium", tools="effort-none")),
    (r"gpt-5\.6(-sol|-terra|-luna)?",
     _OpenAIFamily("gpt-5.6", efforts=_NONE_TO_MAX, default_effort="medium", tools="effort-none")),
    (r"gpt-6-(sol|luna)", _OpenAIFamily("gpt-6 sol/luna", efforts=_NONE_TO_MAX, default_effort="not none",
                                        tools="effort-none")),
    (r"gpt-6-astra", _OpenAIFamily("gpt-6-astra", refuses_none=True, tools="responses-only")),
    (r"gpt-6\.1-sol", _OpenAIFamily("gpt-6.1-sol", efforts=_LOW_TO_MAX, tools="responses-only")),
    (r"gpt-6\.1-terra", _OpenAIFamily("gpt-6.1-terra", efforts=_NONE_TO_MAX, default_effort="medium")),
    (r"gpt-6\.2-(sol|astra)", _OpenAIFamily("gpt-6.2", refuses_none=True)),
    # Other reasoning models (a new tier, a codex or mini variant): max_completion_tokens, and the general rule.
    (r"(o[1-9]|gpt-[5-9](\.\d+)?)(-[a-z0-9.]+)*", _OpenAIFamily("reasoning")),
    (r"gpt-4o(-mini)?(-[a-z-]+)?|gpt-4\.1(-mini|-nano)?|gpt-4(-turbo|-32k)?(-preview)?|gpt-3\.5-turbo(-\d+k)?"
     r"|chatgpt-4o-latest", _OpenAIFamily("not reasoning", reasoning=False)),
)
_PATTERNS = tuple((re.compile(rf"(?:{pattern})(?:-\d{{4}}-\d{{2}}-\d{{2}})?"), family)
                  for pattern, family in _OPENAI_FAMILIES)
# *-chat-latest models are chat models of a reasoning line: no rule documented, sent as given.
_CHAT_LATEST = re.compile(r".*-chat(-latest)?")


@functools.lru_cache(maxsize=1024)
def _openai_family(model: str) -> _OpenAIFamily | None:
    name = model.split(":")[1] if model.startswith("ft:") and model.count(":") >= 1 else model
    if _CHAT_LATEST.fullmatch(name):
        return None
    for pattern, family in _PATTERNS:
        if pattern.fullmatch(name):
            return family
    return None


def is_openai_model(model: str) -> bool:
    """Whether ``model`` names one of OpenAI's own chat models (whose request shapes OpenAI's docs describe)."""
    return _openai_family(model) is not None or bool(_CHAT_LATEST.fullmatch(model))


def openai_params(model: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as sent to ``model``: ``max_tokens`` as ``max_completion_tokens`` to a reasoning model (both
    given: unchanged, for ``openai_refusal`` to refuse). The same dict when nothing changes."""
    if "max_tokens" not in params:
        return params
    family = _openai_family(model)
    if family is None or not family.reasoning:
        return params
    cap = params["max_tokens"]
    if cap is not None and params.get("max_completion_tokens") is not None:
        return params
    renamed = {key: value for key, value in params.items() if key != "max_tokens"}
    if renamed.get("max_completion_tokens") is None:
        renamed["max_completion_tokens"] = cap
    return renamed


def openai_body(request: ChatRequest) -> dict[str, Any]:
    """The chat-completions body for ``request`` (real-time and batch lines alike): ``openai_params`` of its
    params, its model and messages."""
    return {**openai_params(request.model, request.params), "model": request.model, "messages": request.messages}


def thinking_room(model: str, params: Mapping[str, Any], *, provider: str = "openai") -> int | None:
    """``THINKING_ROOM`` when a request to ``model`` (sent to ``provider``) reasons (OpenAI's reasoning families at
    the effort it runs at: its ``reasoning_effort``, else the model's default) and its ``max_completion_tokens`` (or
    ``max_tokens``) is below it; else None (no cap, no reasoning, or room enough)."""
    if provider != "openai":
        return None
    family = _openai_family(model)
    if family is None or not family.reasoning:
        return None
    cap = params.get("max_completion_tokens")
    cap = params.get("max_tokens") if cap is None else cap
    if not isinstance(cap, int) or isinstance(cap, bool) or cap >= THINKING_ROOM:
        return None
    effort = params.get("reasoning_effort")
    # Undocumented defaults are taken to reason: every family here does unless told 'none'.
    at = effort if effort is not None else family.default_effort
    return None if at == "none" else THINKING_ROOM


def openai_refusal(model: str, params: Mapping[str, Any]) -> Refusal | None:
    """The first thing ``model`` refuses in ``params`` (as sent: after ``openai_params``), or None."""
    family = _openai_family(model)
    if family is None:
        return None
    effort = params.get("reasoning_effort")
    if not family.reasoning:
        if effort is not None:
            return Refusal("params.reasoning_effort", f"{model} does not reason: remove reasoning_effort",
                           "Unrecognized request argument supplied: reasoning_effort")
        return None
    if params.get("max_tokens") is not None:
        return Refusal("params.max_tokens",
                       f"{model} takes max_completion_tokens (llm-dispatch sends max_tokens as it); this prompt sets "
                       "both: remove max_tokens",
                       "Unsupported parameter: 'max_tokens' is not supported with this model. "
                       "Use 'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")
    if effort is not None:
        problem = _effort_refusal(model, family, effort)
        if problem is not None:
            return problem
    # The effort the request runs at: its own, else "not none" for a model that always reasons, else the documented
    # default (None when undocumented: nothing is refused on a guess).
    at = effort if effort is not None else "not none" if family.has_none is False else family.default_effort
    if at is not None and at != "none":
        if effort is not None:
            why, instead = f"at reasoning_effort {shown(effort)}", "set reasoning_effort to 'none' or remove"
        elif family.has_none is False:
            why, instead = "(it always reasons)", "remove"
        else:
            default = f" {shown(at)}" if at != "not none" else ""
            why, instead = f"at its default reasoning_effort{default}", "set reasoning_effort to 'none' or remove"
        for name in _SAMPLING:
            value = params.get(name)
            if value is None or (name in ("temperature", "top_p") and value == 1) or (name == "logprobs" and not value):
                continue
            if name in ("temperature", "top_p"):
                api = (f"Unsupported value: '{name}' does not support {shown_json(value)} with this model. "
                       "Only the default (1) value is supported.")
                code = "unsupported_value"
            else:
                api, code = f"Unsupported parameter: '{name}' is not supported with this model.", "unsupported_parameter"
            return Refusal(f"params.{name}", f"{model} takes no {name} {why}: {instead} {name}", api, name, code)
        if params.get("tools") and family.tools == "effort-none":
            return _tools_refusal(model, family, f"runs {why.removeprefix('(').removesuffix(')')}")
    if params.get("tools") and family.tools == "responses-only":
        return _tools_refusal(model, family, "")
    if params.get("stop") is not None and not family.takes_stop:
        return Refusal("params.stop", f"{model} takes no stop sequences: remove stop",
                       "Unsupported parameter: 'stop' is not supported with this model.", "stop",
                       "unsupported_parameter")
    return None


def _effort_refusal(model: str, family: _OpenAIFamily, effort: Any) -> Refusal | None:
    if not isinstance(effort, str):
        return None  # a type problem, said by ``param_problem``
    takes = family.efforts
    if takes is None:
        if not (family.refuses_none and effort == "none"):
            return None
        return Refusal("params.reasoning_effort", f"{model} always reasons: give a reasoning_effort other than 'none'",
                       f"Unsupported value: 'none' is not supported with the '{model}' model.", "reasoning_effort",
                       "unsupported_value")
    if effort in takes:
        return None
    return Refusal("params.reasoning_effort", f"{model} takes reasoning_effort {_listed(takes, 'or')}, not "
                   f"{shown(effort)}",
                   f"Unsupported value: {shown(effort)} is not supported with the '{model}' model. Supported values "
                   f"are: {_listed(takes, 'and')}.", "reasoning_effort", "unsupported_value")


def _listed(values: tuple[str, ...], last: str) -> str:
    quoted = [f"'{value}'" for value in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", {last} {quoted[-1]}"


def _tools_refusal(model: str, family: _OpenAIFamily, runs: str) -> Refusal:
    if family.tools == "responses-only":
        message = (f"{model} calls tools only through OpenAI's Responses API, which llm-dispatch does not use: "
                   "remove tools, or use a model that takes them on Chat Completions")
    else:
        message = (f"{model} takes function tools on Chat Completions only with reasoning_effort 'none' (this prompt "
                   f"{runs}): set reasoning_effort to 'none'")
    return Refusal("params.tools", message,
                   f"Function tools with reasoning_effort are not supported for {model} in /v1/chat/completions. "
                   "To use function tools, use /v1/responses or set reasoning_effort to 'none'.",
                   "reasoning_effort", None)


def batch_metadata_problem(metadata: Mapping[str, Any], *, added: int) -> str | None:
    """What OpenAI would refuse in a batch's ``metadata`` once llm-dispatch adds ``added`` keys of its own, or None."""
    room = OPENAI_BATCH_METADATA_KEYS - added
    if len(metadata) > room:
        return (f"OpenAI takes {OPENAI_BATCH_METADATA_KEYS} metadata keys on a batch and llm-dispatch sets {added}: "
                f"give at most {room}, not {len(metadata)}")
    for key, value in metadata.items():
        if not isinstance(key, str) or len(key) > MAX_METADATA_KEY:
            return f"batch metadata key {shown(key)} must be a string of at most {MAX_METADATA_KEY} characters"
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE:
            return (f"batch metadata value of {shown(key)} must be a string of at most {MAX_METADATA_VALUE} "
                    "characters")
    return None
