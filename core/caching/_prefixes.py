"""The prefixes a job's prompts share: each prompt's canonical prefix as the providers cache it (what precedes the
messages on the wire, tools and the answer's schema, then every message but the last, in wire order), its prompts
grouped by it with its token count."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._json import canonical_json
from .._types import ChatRequest
from ..pricing._tokens import TOKENS_PER_REPLY, estimate_input_tokens

__all__ = ["PrefixGroup", "PrefixGroups", "find_prefix_groups", "prefix_key", "sets_breakpoints"]

# What the providers put before the messages (OpenAI renders tools and the answer's format first; Anthropic caches
# tools, then system, then messages): parameters that are part of every prompt's prefix.
_PREFIX_PARAMS = ("tools", "functions", "tool_choice", "response_format")


@dataclass(slots=True)
class PrefixGroup:
    """Prompts that share one canonical prefix on one model: ``key`` names it (a short digest), ``prefix_tokens``
    is its estimated length (``pricing``'s estimate), ``prefix_messages`` how many leading messages it holds.
    ``own_breakpoints``: some prompt of it sets ``cache_control`` itself (left as given)."""

    key: str
    provider: str
    model: str
    endpoint: str
    prefix_messages: int
    prefix_tokens: int
    prompts: int = 0
    own_breakpoints: bool = False
    first_ids: list[int] = field(default_factory=list)


def prefix_key(request: ChatRequest) -> str | None:
    """The digest of ``request``'s canonical prefix, with its model and endpoint; None when it has no prefix to
    share (a single message and nothing before it)."""
    if len(request.messages) < 2:
        return None
    digest = hashlib.sha1(canonical_json([request.model, request.endpoint,
                                          [request.params.get(name) for name in _PREFIX_PARAMS]]).encode(),
                          usedforsecurity=False)
    for message in request.messages[:-1]:
        role, content = message.get("role"), message.get("content")
        if len(message) == 2 and isinstance(role, str) and isinstance(content, str):
            # A plain text turn (the long instruction of most jobs) is hashed as its text, not as JSON: the JSON
            # encoding of a long text costs more than hashing it. Each part is framed by its length, so no two
            # prefixes share a digest by where one part ends.
            for part in (b"t", role.encode(), content.encode("utf-8", "surrogatepass")):
                digest.update(len(part).to_bytes(8, "little"))
                digest.update(part)
        else:
            part = b"j" + canonical_json(message).encode()
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()[:12]


def sets_breakpoints(request: ChatRequest) -> bool:
    """Whether ``request`` sets any ``cache_control`` itself (on a tool or a content block)."""
    return any(isinstance(item, dict) and "cache_control" in item for item in _blocks(request))


def _blocks(request: ChatRequest) -> Iterable[Any]:
    yield from request.params.get("tools") or ()
    for message in request.messages:
        content = message.get("content")
        if isinstance(content, list):
            yield from content


class PrefixGroups:
    """Groups found as prompts are added one at a time (a job read a page at a time); ``groups`` the result."""

    def __init__(self, *, provider_of: Callable[[str], str], keep_ids: int = 3) -> None:
        self._provider_of, self._keep_ids = provider_of, keep_ids
        self._groups: dict[str, PrefixGroup] = {}
        # A prefix seen once so far, by its key: its prompt's id and whether it sets breakpoints. A group (and its prefix's token count) is made only
        # once a second prompt shares it, so a job of unique prefixes holds a key and an id per prompt, no more.
        self._once: dict[str, tuple[int, bool]] = {}
        self.prompts = 0

    def add(self, prompt_id: int, request: ChatRequest) -> None:
        self.prompts += 1
        key = prefix_key(request)
        if key is None:
            return
        group = self._groups.get(key)
        if group is None:
            once = self._once.pop(key, None)
            if once is None:
                self._once[key] = (prompt_id, sets_breakpoints(request))
                return
            first, first_marks = once
            prefix = ChatRequest(model=request.model, messages=request.messages[:-1],
                                 params={name: request.params[name] for name in _PREFIX_PARAMS
                                         if request.params.get(name)}, endpoint=request.endpoint)
            group = self._groups[key] = PrefixGroup(
                key=key, provider=self._provider_of(request.model), model=request.model, endpoint=request.endpoint,
                prefix_messages=len(request.messages) - 1,
                prefix_tokens=estimate_input_tokens(prefix) - TOKENS_PER_REPLY, prompts=1,
                own_breakpoints=first_marks, first_ids=[first][:self._keep_ids])
        group.prompts += 1
        group.own_breakpoints = group.own_breakpoints or sets_breakpoints(request)
        if len(group.first_ids) < self._keep_ids:
            group.first_ids.append(prompt_id)

    def groups(self) -> list[PrefixGroup]:
        """The groups of more than one prompt, in order of their first prompt (prompt ids come in input order)."""
        groups = list(self._groups.values())
        if self._keep_ids:
            groups.sort(key=lambda group: group.first_ids[0])
        return groups


def find_prefix_groups(
    requests: Iterable[tuple[int, ChatRequest]], *, provider_of: Callable[[str], str], keep_ids: int = 3,
) -> list[PrefixGroup]:
    """The groups of ``requests`` (prompt id, request) that share a prefix, in order of their first prompt; a prefix
    only one prompt has is no group. ``provider_of``: a model's provider (``core.provider_lookup``)."""
    found = PrefixGroups(provider_of=provider_of, keep_ids=keep_ids)
    for prompt_id, request in requests:
        found.add(prompt_id, request)
    return found.groups()
