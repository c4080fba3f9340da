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
from dataclasses import dataclass
from typing import Literal

from .._exceptions import APIError, APIStatusError

__all__ = ["STOP_AFTER", "LastingKind", "RunStop", "Stopped", "lasting_failure"]

# Identical lasting answers before a provider's (or a model's) requests stop; also the most requests of a model
# in flight before one of them has been answered otherwise.
STOP_AFTER = 3

# key: the key is refused (401); credit: the account cannot pay (OpenAI's insufficient_quota 429, Anthropic's
# 402 billing_error and spend-limit 429s); access: the key may not use this model or endpoint (403); model: no such
# model, or no such endpoint (404); wait: the provider asks to wait longer than the client waits (Retry-After).
LastingKind = Literal["key", "credit", "access", "model", "wait"]
# The account's, so every model of the provider is stopped; the others stop only their model's requests.
_PROVIDER_WIDE: frozenset[str] = frozenset({"key", "credit", "wait"})
CREDIT_CODES = frozenset({
    "insufficient_quota",  # OpenAI
    "billing_error",  # Anthropic's error type, 402
    "enforced_spend_limit_reached", "contract_spend_limit_reached",  # Anthropic's 429 error_code details
})


# Keys refused with another status than 401: Google answers a wrong key 400 INVALID_ARGUMENT, reason API_KEY_INVALID.
KEY_CODES = frozenset({"API_KEY_INVALID"})


def lasting_failure(status: int, code: str | None) -> LastingKind | None:
    """Whether an error answer (``status``, the provider's ``code`` or error type) stays the same on every try."""
    if status == 401 or code in KEY_CODES:
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


class _Gate:
    """Probing one provider or model: until it has given an answer that is not lasting, at most ``probes`` requests
    go out (then the next wait for them to come back); once it has, every request passes at once."""

    __slots__ = ("_budget", "_changed", "_out", "_probes", "proven")

    def __init__(self, probes: int) -> None:
        self._probes = self._budget = probes
        self._out = 0
        self._changed = asyncio.Condition()
        self.proven = False

    async def enter(self, *, blocked: Callable[[], bool]) -> bool | None:
        """None: do not send (``blocked()``); True: sent as a probe; False: sent, the gate is open."""
        if self.proven:
            return None if blocked() else False
        async with self._changed:
            await self._changed.wait_for(lambda: self.proven or self._budget > 0 or blocked())
            if blocked():
                return None
            if self.proven:
                return False
            self._budget -= 1
            self._out += 1
            return True

    async def leave(self) -> None:
        """A probe came back. When all have and none proved anything (answers that differ), probe again."""
        async with self._changed:
            self._out -= 1
            if self._out == 0 and self._budget == 0:
                self._budget = self._probes
            self._changed.notify_all()

    async def wake(self) -> None:
        """Let waiters look again (the gate was proven, or something was stopped)."""
        async with self._changed:
            self._changed.notify_all()


class RunStop:
    """The stop of one run's real-time requests (every chunk's): see the module notes.

    ``provider_of`` names a model's provider. ``turn(model)`` is entered around each request; it yields False
    when the request is not to be sent (its provider or model was stopped), and the caller leaves its prompts
    pending. ``answered`` and ``failed`` report each request's outcome. A request passes its provider's gate,
    then its model's: so a refused key costs ``after`` requests whatever the models, an unknown model ``after``
    of its own.
    """

    def __init__(self, *, provider_of: Callable[[str], str], after: int = STOP_AFTER) -> None:
        self._provider_of = provider_of
        self._after = after
        self._gates: dict[tuple[str, str | None], _Gate] = {}
        # Per provider or model: the last lasting answer's (kind, status, code) and how many came in a row.
        self._streaks: dict[tuple[str, str | None], tuple[tuple[str, int, str | None], int]] = {}
        self.stopped: dict[tuple[str, str | None], Stopped] = {}
        # Models whose provider and own gate are proven and that nothing stopped: their requests pass at once.
        self._clear: set[str] = set()

    def clear(self, model: str) -> bool:
        """Whether a request of ``model`` goes without a ``turn``: it would pass at once (its provider and the model
        have answered, and neither is stopped)."""
        return model in self._clear

    def blocked(self, model: str) -> bool:
        provider = self._provider_of(model)
        return (provider, None) in self.stopped or (provider, model) in self.stopped

    def provider_stopped(self, provider: str) -> bool:
        return (provider, None) in self.stopped

    def _gate(self, key: tuple[str, str | None]) -> _Gate:
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(self._after)
        return gate

    @asynccontextmanager
    async def turn(self, model: str) -> AsyncIterator[bool]:
        provider = self._provider_of(model)
        gates = (self._gate((provider, None)), self._gate((provider, model)))
        probing: list[_Gate] = []
        try:
            for gate in gates:
                entered = await gate.enter(blocked=lambda: self.blocked(model))
                if entered is None:
                    yield False
                    return
                if entered:
                    probing.append(gate)
            yield True
        finally:
            for gate in probing:
                await gate.leave()

    async def answered(self, model: str) -> None:
        """A request of ``model`` got an answer (or a failure that is not lasting): send the rest at full speed."""
        if model in self._clear and not self._streaks:
            return  # nothing to prove or to reset
        provider = self._provider_of(model)
        for key in ((provider, None), (provider, model)):
            self._streaks.pop(key, None)
            gate = self._gates.get(key)
            if gate is not None and not gate.proven:
                gate.proven = True
                await gate.wake()
        gates = (self._gates.get((provider, None)), self._gates.get((provider, model)))
        if all(gate is not None and gate.proven for gate in gates) and not self.blocked(model):
            self._clear.add(model)

    async def failed(self, model: str, error: BaseException) -> None:
        if not isinstance(error, APIStatusError) or error.lasting is None:
            if isinstance(error, APIError):
                await self.answered(model)
            return
        provider = self._provider_of(model)
        # The account's failures count over the provider's models (a refused key answers every model alike).
        key = (provider, None) if error.lasting in _PROVIDER_WIDE else (provider, model)
        signature = (error.lasting, error.status_code, error.code)
        seen, count = self._streaks.get(key, (signature, 0))
        count = count + 1 if seen == signature else 1
        self._streaks[key] = (signature, count)
        if count >= self._after and key not in self.stopped:
            self.stopped[key] = Stopped(key[0], key[1], error, count)
            self._clear.clear()
            for gate in list(self._gates.values()):
                await gate.wake()

    def left(self, model: str, prompts: int) -> None:
        """``prompts`` of ``model`` were not sent because it was stopped."""
        provider = self._provider_of(model)
        found = self.stopped.get((provider, None)) or self.stopped.get((provider, model))
        if found is not None:
            found.left += prompts
