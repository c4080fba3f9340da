"""Message shapes as each provider accepts them: the input check refuses with the file what the API would refuse
with a 400, and the simulator answers that 400 (``Refusal.api_message``), so neither is green where the
provider would not be.

OpenAI (openai-python ``types/chat/*_message_param.py``, generated from OpenAI's spec): roles system, developer,
user, assistant, tool (and the deprecated function); an assistant turn's content "Required unless tool_calls or
function_call is specified"; a tool message needs ``content`` and ``tool_call_id``; user content parts are
text, image_url (``{url, detail?}``, "Either a URL of the image or the base64 encoded image data"),
input_audio (``{data, format: wav|mp3}``) and file (``{file_data | file_id, filename?}``); system, developer and
tool parts are text; assistant parts text and refusal. The 400s for an unknown part type, a malformed image URL,
a tool message without its id, and tool calls left unanswered are quoted as observed.

Anthropic (anthropic-sdk-python ``types/message_param.py``, ``content_block_param.py``, ``image_block_param.py``):
roles user and assistant; content a string or blocks of the 16 documented types; an image's base64 media type
one of image/jpeg, png, gif, webp; every ``tool_use`` answered by a ``tool_result`` in the next turn and every
``tool_result`` answering a ``tool_use`` of the turn before; under ``anthropic-version: 2026-10-21`` no document
block in an assistant turn and no citations on a user's text block (api/migration-2026-10-21).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from ._model_rules import ANTHROPIC_SAMPLING_REMOVED_IN, Refusal
from .._params import shown

__all__ = ["PartRules", "anthropic_messages_refusal", "openai_messages_refusal"]

# "openai": a part must be one OpenAI takes for its role. "any": OpenAI's own kinds are checked, others left to the
# provider (Anthropic's blocks, translated then checked by ``anthropic_messages_refusal``; another server's kinds).
PartRules = Literal["openai", "any"]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_OPENAI_ROLES = (*_ROLES, "function")
_PARTS = {
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
    "system": ("text",),
    "developer": ("text",),
    "tool": ("text",),
}
_DETAILS = ("auto", "low", "high")
_AUDIO_FORMATS = ("wav", "mp3")
# A data URL OpenAI and Anthropic read as an image: an image MIME type, base64, some data.
_IMAGE_DATA_URL = re.compile(r"data:image/[a-zA-Z0-9.+-]+;base64,.+", re.DOTALL)
_WEB_URL = re.compile(r"https?://[^\s/?#]+[^\s]*", re.IGNORECASE)

_ANTHROPIC_BLOCKS = (
    "text", "image", "document", "search_result", "thinking", "redacted_thinking", "tool_use", "tool_result",
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "tool_search_tool_result",
    "container_upload",
)
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _wrong_type(where: str, ours: str, *, expected: str, got: Any) -> Refusal:
    return Refusal(where, ours, f"Invalid type for '{where}': expected {expected}, but got {_type_name(got)} instead.",
                   where, "invalid_type")


def _listed(values: tuple[str, ...]) -> str:
    quoted = [f"'{value}'" for value in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


# --------------------------------------------------------------------------------------------------- OpenAI


def openai_messages_refusal(messages: Any, *, parts: PartRules = "openai") -> Refusal | None:
    """The first thing OpenAI's chat completions refuse in ``messages`` (as the prompt file gives them), or None."""
    if not isinstance(messages, list) or not messages:
        return Refusal("messages", "must be a non-empty list of {role, content} objects",
                       "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
                       "array instead." if isinstance(messages, list) else
                       f"Invalid type for 'messages': expected an array, but got {_type_name(messages)} instead.",
                       "messages", "empty_array" if isinstance(messages, list) else "invalid_type")
    open_calls: dict[str, int] = {}  # tool call id -> the assistant message that made it, until answered
    calls_from: int | None = None
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            return _wrong_type(where, "must be an object with 'role' and 'content'", expected="an object", got=message)
        role = message.get("role")
        problem = _role_problem(role, where=where, parts=parts)
        if problem is not None:
            return problem
        assert isinstance(role, str)  # _role_problem refuses any other
        if role != "tool" and calls_from is not None and open_calls:
            return _unanswered(open_calls, calls_from)
        if role != "tool":
            open_calls, calls_from = {}, None
        problem = _message_problem(message, role=role, where=where, parts=parts)
        if problem is not None:
            return problem
        if role == "assistant" and message.get("tool_calls"):
            open_calls = {call["id"]: index for call in message["tool_calls"]}
            calls_from = index
        elif role == "tool":
            call_id = message["tool_call_id"]
            if calls_from is None or call_id not in open_calls:
                return Refusal(f"{where}.tool_call_id",
                               f"a tool message answers a tool call of the assistant message just before it; "
                               f"{shown(call_id)} is none of them",
                               "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                               "message with 'tool_calls'.", f"messages.[{index}].role", None)
            del open_calls[call_id]
    return None


def _role_problem(role: Any, *, where: str, parts: PartRules) -> Refusal | None:
    if role is None:
        return Refusal(f"{where}.role", "needs a role", f"Missing required parameter: '{where}.role'.",
                       f"{where}.role", "missing_required_parameter")
    roles = _OPENAI_ROLES if parts == "openai" else _ROLES
    if role not in roles:
        return Refusal(f"{where}.role", f"role must be one of {', '.join(sorted(roles))}, not {shown(role)}",
                       f"Invalid value: {shown(role)}. Supported values are: {_listed(_OPENAI_ROLES)}.",
                       f"{where}.role", "invalid_value")
    return None


def _message_problem(message: Mapping[str, Any], *, role: str, where: str, parts: PartRules) -> Refusal | None:
    content = message.get("content")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            index = where[len("messages["):-1]
            return Refusal(f"{where}.tool_call_id", "a tool message needs 'tool_call_id', the id of the tool call it "
                           "answers", "Missing parameter 'tool_call_id': messages with role 'tool' must have a "
                           "'tool_call_id'.", f"messages.[{index}].tool_call_id", None)
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            problem = _tool_calls_problem(calls, where=f"{where}.tool_calls", parts=parts)
            if problem is not None:
                return problem
        if content is None and (calls or message.get("function_call")):
            return None  # a turn that only calls tools
    if content is None and role == "function":
        return None
    if content is None:
        return Refusal(f"{where}.content", "content must be a string or a list of content parts",
                       f"Missing required parameter: '{where}.content'.", f"{where}.content",
                       "missing_required_parameter")
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return _wrong_type(f"{where}.content", "content must be a string or a list of content parts",
                           expected="a string or an array", got=content)
    if not content:
        return Refusal(f"{where}.content", "content must be a string or a non-empty list of content parts",
                       f"Invalid '{where}.content': empty array. Expected an array with minimum length 1, but got an "
                       "empty array instead.", f"{where}.content", "empty_array")
    for number, part in enumerate(content):
        problem = _part_problem(part, role=role, where=f"{where}.content[{number}]", parts=parts)
        if problem is not None:
            return problem
    return None


def _tool_calls_problem(calls: Any, *, where: str, parts: PartRules) -> Refusal | None:
    if not isinstance(calls, list):
        return _wrong_type(where, "must be a list of tool calls", expected="an array", got=calls)
    for number, call in enumerate(calls):
        at = f"{where}[{number}]"
        if not isinstance(call, Mapping):
            return _wrong_type(at, "must be a tool call object", expected="an object", got=call)
        if not isinstance(call.get("id"), str) or not call["id"]:
            return Refusal(f"{at}.id", "a tool call needs its 'id' (the tool message answering it names it)",
                           f"Missing required parameter: '{at}.id'.", f"{at}.id", "missing_required_parameter")
        kind = call.get("type", "function")
        if kind not in ("function", "custom"):
            return Refusal(f"{at}.type", f"a tool call's type is 'function' or 'custom', not {shown(kind)}",
                           f"Invalid value: {shown(kind)}. Supported values are: 'function' and 'custom'.",
                           f"{at}.type", "invalid_value")
        body = call.get(kind)
        if not isinstance(body, Mapping) or not isinstance(body.get("name"), str):
            return Refusal(f"{at}.{kind}.name", f"a {kind} tool call needs {kind}.name",
                           f"Missing required parameter: '{at}.{kind}.name'.", f"{at}.{kind}.name",
                           "missing_required_parameter")
        argument = "arguments" if kind == "function" else "input"
        value = body.get(argument)
        if not isinstance(value, str) and not (parts == "any" and isinstance(value, Mapping)):
            return _wrong_type(f"{at}.{kind}.{argument}", f"a {kind} tool call's {argument} must be a string (of "
                               "JSON)", expected="a string", got=value)
    return None


def _part_problem(part: Any, *, role: str, where: str, parts: PartRules) -> Refusal | None:
    if not isinstance(part, Mapping):
        return _wrong_type(where, "a content part must be an object with a 'type'", expected="an object", got=part)
    kind = part.get("type")
    if not isinstance(kind, str):
        return Refusal(f"{where}.type", "a content part needs its 'type'",
                       f"Missing required parameter: '{where}.type'.", f"{where}.type", "missing_required_parameter")
    allowed = _PARTS.get(role, ("text",))
    if parts == "openai" and kind not in allowed:
        return Refusal(f"{where}.type", f"a {role} message's content parts are {', '.join(allowed)}, not {shown(kind)}",
                       f"Invalid value: {shown(kind)}. Supported values are: {_listed(allowed)}.",
                       f"{where}.type", "invalid_value")
    if kind == "text" and not isinstance(part.get("text"), str):
        return Refusal(f"{where}.text", "a text part needs 'text', a string",
                       f"Missing required parameter: '{where}.text'.", f"{where}.text", "missing_required_parameter")
    if kind == "image_url":
        return _image_url_problem(part.get("image_url"), where=f"{where}.image_url")
    if parts != "openai":
        return None
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str) \
                or audio.get("format") not in _AUDIO_FORMATS:
            return Refusal(f"{where}.input_audio", "an input_audio part needs {data: base64, format: 'wav' or 'mp3'}",
                           f"Invalid value for '{where}.input_audio': expected an object with 'data' and a 'format' "
                           f"of {_listed(_AUDIO_FORMATS)}.", f"{where}.input_audio", "invalid_value")
    if kind == "file":
        file = part.get("file")
        if not isinstance(file, Mapping) or not (isinstance(file.get("file_data"), str)
                                                 or isinstance(file.get("file_id"), str)):
            return Refusal(f"{where}.file", "a file part needs file.file_data (base64) or file.file_id",
                           f"Invalid value for '{where}.file': expected an object with 'file_data' or 'file_id'.",
                           f"{where}.file", "invalid_value")
    if kind == "refusal" and not isinstance(part.get("refusal"), str):
        return Refusal(f"{where}.refusal", "a refusal part needs 'refusal', a string",
                       f"Missing required parameter: '{where}.refusal'.", f"{where}.refusal",
                       "missing_required_parameter")
    return None


def _image_url_problem(image: Any, *, where: str) -> Refusal | None:
    if not isinstance(image, Mapping):
        return _wrong_type(where, "image_url must be an object: {\"url\": ...}", expected="an object", got=image)
    url = image.get("url")
    if not isinstance(url, str) or not (_WEB_URL.fullmatch(url[:4096]) or _IMAGE_DATA_URL.match(url)):
        return Refusal(f"{where}.url", f"image_url.url must be an http(s) URL or a data URL like "
                       f"data:image/png;base64,..., not {shown(url)}",
                       f"Invalid image URL: '{where}.url'. Expected a base64-encoded data URL with an image MIME type "
                       "(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got a value without the 'data:' "
                       "prefix.", f"{where}.url", "invalid_value")
    detail = image.get("detail")
    if detail is not None and detail not in _DETAILS:
        return Refusal(f"{where}.detail", f"image_url.detail is one of {', '.join(_DETAILS)}, not {shown(detail)}",
                       f"Invalid value: {shown(detail)}. Supported values are: {_listed(_DETAILS)}.",
                       f"{where}.detail", "invalid_value")
    return None


def _unanswered(open_calls: dict[str, int], calls_from: int) -> Refusal:
    ids = ", ".join(open_calls)
    return Refusal(f"messages[{calls_from}].tool_calls",
                   f"each tool call of messages[{calls_from}] needs a tool message answering it next; none answers "
                   f"{shown(ids)}",
                   "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                   f"'tool_call_id'. The following tool_call_ids did not have response messages: {ids}",
                   f"messages.[{calls_from}].role", None)


# ------------------------------------------------------------------------------------------------ Anthropic


def anthropic_messages_refusal(body: Mapping[str, Any], *, version: str) -> Refusal | None:
    """The first thing Anthropic's Messages API refuses in the messages of ``body`` (as sent, after the
    translation) under ``anthropic-version: version``, or None. Its field is ``messages``; the message says where
    in the body sent, whose turns are not the file's (system hoisted, tool results merged)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None  # the translation made it; a file's own shape problems are said before
    removed = version >= ANTHROPIC_SAMPLING_REMOVED_IN
    uses_before: set[str] = set()
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return _sent(f"messages.{index}", "Input should be a valid dictionary")
        role = message.get("role")
        if role not in ("user", "assistant"):
            return _sent(f"messages.{index}.role", "Input should be 'user' or 'assistant'")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            return _sent(f"messages.{index}.content", "Input should be a valid string or a list of content blocks")
        uses: set[str] = set()
        results: set[str] = set()
        for number, block in enumerate(blocks):
            at = f"messages.{index}.content.{number}"
            problem = _block_problem(block, role=role, at=at, removed=removed)
            if problem is not None:
                return problem
            if block["type"] == "tool_use":
                uses.add(str(block.get("id")))
            elif block["type"] == "tool_result":
                results.add(str(block.get("tool_use_id")))
        if results - uses_before:
            unexpected = ", ".join(sorted(results - uses_before))
            return _sent(f"messages.{index}.content", f"unexpected `tool_use_id` found in `tool_result` blocks: "
                         f"{unexpected}. Each `tool_result` block must have a corresponding `tool_use` block in the "
                         "previous message.")
        if uses_before - results and index > 0:
            missing = ", ".join(sorted(uses_before - results))
            return _sent(f"messages.{index - 1}", f"`tool_use` ids were found without `tool_result` blocks "
                         f"immediately after: {missing}. Each `tool_use` block must have a corresponding "
                         "`tool_result` block in the next message.")
        uses_before = uses
    return None


def _block_problem(block: Any, *, role: str, at: str, removed: bool) -> Refusal | None:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        return _sent(at, "Input should be a content block with a 'type'")
    kind = block["type"]
    if kind not in _ANTHROPIC_BLOCKS:
        return _sent(f"{at}.type", f"Input tag {shown(kind)} found using 'type' does not match any of the expected "
                     f"tags: {_listed(_ANTHROPIC_BLOCKS)}")
    if kind == "text" and not isinstance(block.get("text"), str):
        return _sent(f"{at}.text", "Field required")
    if kind == "image":
        source = block.get("source")
        if not isinstance(source, Mapping):
            return _sent(f"{at}.source", "Field required")
        if source.get("type") == "base64" and source.get("media_type") not in _IMAGE_TYPES:
            return _sent(f"{at}.source.base64.media_type",
                         f"Input should be {', '.join(repr(t) for t in _IMAGE_TYPES[:-1])} or {_IMAGE_TYPES[-1]!r}")
        if source.get("type") == "url" and not _WEB_URL.fullmatch(str(source.get("url"))[:4096]):
            return _sent(f"{at}.source.url.url", "Input should be a valid URL")
    if kind in ("tool_use", "server_tool_use", "thinking", "redacted_thinking") and role != "assistant":
        return _sent(f"{at}", f"`{kind}` blocks can only be in `assistant` messages")
    if kind == "tool_result" and role != "user":
        return _sent(f"{at}", "`tool_result` blocks can only be in `user` messages")
    if kind == "tool_use" and not (isinstance(block.get("id"), str) and block["id"]):
        return _sent(f"{at}.id", "Field required")
    if kind == "tool_result" and not (isinstance(block.get("tool_use_id"), str) and block["tool_use_id"]):
        return _sent(f"{at}.tool_use_id", "Field required")
    if removed and kind == "document" and role == "assistant":
        return _sent(f"{at}", "`document` blocks are not accepted in `assistant` messages")
    if removed and kind == "text" and role == "user" and block.get("citations"):
        return _sent(f"{at}.citations", "`citations` are not accepted on text blocks in `user` messages")
    return None


def _sent(path: str, problem: str) -> Refusal:
    return Refusal("messages", f"Anthropic refuses it (as sent, {path}: {problem})", f"{path}: {problem}")
