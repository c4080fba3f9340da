"""Failures that cannot get better while a run goes on, and the run's stop on them.

A key that is refused, an account out of credit, a model that does not exist or that the key may not use: every
other request of the run would get the same answer. ``lasting_failure`` names those answers; ``RunStop`` sends at
most ``STOP_AFTER`` requests of a model before any of them has been answered otherwise, and stops sending a
provider's requests (key, credit) or a model's (access, unknown model) after ``STOP_AFTER`` identical such answers.
What it does not send is left to the next run of the same command, once the cause is fixed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from ._exceptions import APIError, APIStatusError

__all__ = ["STOP_AFTER", "LastingKind", "RunStop", "Stopped", "lasting_failure"]

# Identical lasting answers before a provider's (or a model's) requests stop; also the most requests of a model
# in flight before one of them has been answered otherwise.
STOP_AFTER = 3

# key: the key is refused (401); credit: the account cannot pay (OpenAI's insufficient_quota 429, Anthropic's
# 402 billing_error and spend-limit 429s); access: the key may not use this model or endpoint (403); model: no such
# model, or no such endpoint (404).
LastingKind = Literal["key", "credit", "access", "model"]
# The account's, so every model of the provider is stopped; the others stop only their model's requests.
_PROVIDER_WIDE: frozenset[str] = frozenset({"key", "credit"})
CREDIT_CODES = frozenset({
    "insufficient_quota",  # OpenAI
    "billing_error",  # Anthropic's error type, 402
    "enforced_spend_limit_reached", "contract_spend_limit_reached",  # Anthropic's 429 error_code details
})


def lasting_failure(status: int, code: str | None) -> LastingKind | None:
    """Whether an error answer (``status``, the provider's ``code`` or error type) stays the same on every try."""
    if status == 401:
        return "key"
    if status == 402 or code in CREDIT_CODES:
        return "credit"
    if status == 403:
        return "access"
    if status == 404:
        return "model"
    return None


@dataclass(slots=True)
class Stopped:
    """A provider's or model's requests stopped: the answer that stopped them (its message is the stored one,
    hint included), how many identical answers came, and how many prompts were then not sent."""

    provider: str
    model: str | None  # None: every model of the provider
    error: APIStatusError
    answers: int
    left: int = 0

    @property
    def scope(self) -> str:
        return self.provider if self.model is None else f"{self.provider} {self.model}"

    def describe(self) -> str:
        what = f"stopped sending to {self.scope} after {self.answers} identical answers: {self.error.message}"
        return what.rstrip(".") + "."


@dataclass(slots=True)
class _Model:
    """One model's turn-taking: probing (at most STOP_AFTER in flight) until it has an answer that is not lasting."""

    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(STOP_AFTER))
    proven: bool = False
    # The last lasting answer's kind, status and code, and how many identical ones came in a row.
    last: tuple[str, int, str | None] | None = None
    repeats: int = 0


class RunStop:
    """The stop of one run's real-time requests (every chunk's): see the module notes.

    ``provider_of`` names a model's provider. ``turn(model)`` is entered around each request; it yields False
    when the request is not to be sent (its provider or model was stopped), and the caller leaves its prompts
    pending. ``answered`` and ``failed`` report each request's outcome.
    """

    def __init__(self, *, provider_of: Callable[[str], str], after: int = STOP_AFTER) -> None:
        self._provider_of = provider_of
        self._after = after
        self._models: dict[str, _Model] = {}
        self._providers: dict[str, tuple[tuple[str, int, str | None], int]] = {}
        self.stopped: dict[tuple[str, str | None], Stopped] = {}

    def blocked(self, model: str) -> bool:
        provider = self._provider_of(model)
        return (provider, None) in self.stopped or (provider, model) in self.stopped

    def provider_stopped(self, provider: str) -> bool:
        return (provider, None) in self.stopped

    @asynccontextmanager
    async def turn(self, model: str) -> AsyncIterator[bool]:
        state = self._models.get(model)
        if state is None:
            state = self._models[model] = _Model()
        if state.proven:
            yield not self.blocked(model)
            return
        async with state.gate:
            yield not self.blocked(model)

    def answered(self, model: str) -> None:
        """A request of ``model`` got an answer (or a failure that is not lasting): send the rest at full speed."""
        state = self._models.get(model)
        if state is not None:
            state.proven = True
            state.repeats = 0
        self._providers.pop(self._provider_of(model), None)

    def failed(self, model: str, error: BaseException) -> None:
        if not isinstance(error, APIStatusError) or error.lasting is None:
            if isinstance(error, APIError):
                self.answered(model)
            return
        provider = self._provider_of(model)
        signature = (error.lasting, error.status_code, error.code)
        state = self._models.setdefault(model, _Model())
        state.repeats = state.repeats + 1 if state.last == signature else 1
        state.last = signature
        if error.lasting in _PROVIDER_WIDE:
            # Counted over the provider's models: a refused key answers every model alike.
            seen, count = self._providers.get(provider, (signature, 0))
            count = count + 1 if seen == signature else 1
            self._providers[provider] = (signature, count)
            if count >= self._after:
                self.stopped.setdefault((provider, None), Stopped(provider, None, error, count))
        elif state.repeats >= self._after:
            self.stopped.setdefault((provider, model), Stopped(provider, model, error, state.repeats))

    def left(self, model: str, prompts: int) -> None:
        """``prompts`` of ``model`` were not sent because it was stopped."""
        provider = self._provider_of(model)
        found = self.stopped.get((provider, None)) or self.stopped.get((provider, model))
        if found is not None:
            found.left += prompts
