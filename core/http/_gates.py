"""The gates every attempt of one client passes, and what each answer teaches them.

In order: the shared pause (after a quota 429), the optional RPM/TPM caps of the settings, the pace the
provider's rate-limit headers set, then a slot of the adaptive concurrency limit. What a 429 does to them
is the rule written in ``_limits``'s docstring.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import httpx

from ._failures import Failure
from ._limits import (
    CAPACITY_DECREASE,
    AdaptiveLimiter,
    CapacityWatch,
    Clock,
    Pace,
    PaceMark,
    Permit,
    RateLimiter,
    SharedPause,
    Sleep,
)
from ..wire._ratelimit_headers import Kind, KindLimit, RateLimitHeaders, quota_evidence
from ..wire._responses import error_code
from .._retry import server_retry_after
from ._transport import raw_headers

__all__ = ["Admission", "Gates"]

logger = logging.getLogger(__name__)


# An attempt that passed no pace: every one, until a provider's headers state a limit.
_NO_MARKS: Mapping[Kind, PaceMark] = MappingProxyType({})
# A pause's deadline before any 429 set one.
_NEVER = float("-inf")


class Admission(NamedTuple):
    """One attempt let through: its concurrency slot, where each pace stood, and its estimated tokens."""

    permit: Permit
    tokens: int
    marks: Mapping[Kind, PaceMark] = _NO_MARKS

    def charge(self, kind: Kind) -> int:
        return 1 if kind == "requests" else self.tokens


class Gates:
    """The limits one client's callers share."""

    def __init__(
        self,
        *,
        concurrency: int,
        rpm: int | None,
        tpm: int | None,
        max_retry_after: float,
        rate_limit_headers: RateLimitHeaders,
        clock: Clock,
        sleep: Sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._max_retry_after = max_retry_after
        self.limiter = AdaptiveLimiter(ceiling=concurrency)
        self.pause = SharedPause(clock=clock, sleep=sleep)
        self._rpm = RateLimiter(per_minute=rpm, clock=clock, sleep=sleep) if rpm else None
        self._tpm = RateLimiter(per_minute=tpm, clock=clock, sleep=sleep) if tpm else None
        self._headers = rate_limit_headers
        # One per kind the provider's headers state, made by the first answer that states it.
        self.paces: dict[Kind, Pace] = {}
        self._capacity = CapacityWatch()
        self._capacity_floor = max(1, concurrency // 4)

    @property
    def _free(self) -> bool:
        """No cap set and no pace stated: an attempt waits for nothing but a slot (and a pause, once there was one)."""
        return self._rpm is None and self._tpm is None and not self.paces

    @property
    def counts_tokens(self) -> bool:
        """Whether a request's tokens are charged anywhere (a TPM cap, or a tokens pace the provider stated)."""
        return self._tpm is not None or "tokens" in self.paces

    async def admit(self, tokens: int, *, paced: bool) -> Admission:
        """Wait at every gate in turn; a pause is waited out without holding a concurrency slot.

        A gate with nothing to wait for is passed without awaiting: most attempts find no pause, no cap set
        and a free slot.
        """
        pause = self.pause
        if self._free and pause.deadline == _NEVER:
            permit = self.limiter.try_acquire()
            if permit is not None:
                return Admission(permit, tokens)
        if pause.remaining:
            await pause.wait()
        if self._rpm is not None:
            await self._rpm.acquire(1)
        if self._tpm is not None and tokens > 0:
            await self._tpm.acquire(tokens)
        marks = _NO_MARKS
        if paced and self.paces:
            marks = {kind: await pace.acquire(1 if kind == "requests" else tokens)
                     for kind, pace in list(self.paces.items())}
        while True:
            if pause.remaining:
                await pause.wait()
            seen = pause.deadline
            permit = self.limiter.try_acquire()
            if permit is None:
                permit = await self.limiter.acquire()
            # A 429 elsewhere may have paused everyone while we queued for the slot. (Comparing deadlines
            # rather than reading the clock keeps a test's motionless fake clock from looping here.)
            if pause.deadline == seen or pause.remaining <= 0:
                return Admission(permit, tokens, marks)
            self.limiter.release()

    def release(self) -> None:
        self.limiter.release()

    def used_tokens(self, correction: int) -> None:
        """A TPM cap charged an estimate; ``correction`` is what the answer's usage adds to it (or refunds)."""
        if self._tpm is not None:
            self._tpm.adjust(correction)

    def succeeded(self, admission: Admission) -> None:
        self.limiter.record_success(admission.permit)
        self._capacity.record(limited=False)

    def observe(self, response: httpx.Response, admission: Admission, *, counted: bool) -> dict[Kind, KindLimit]:
        """Keep each kind's pace in step with an answer's headers; the first to state a limit sets the pace.

        ``counted``: whether the provider counted this request against its limits (it does not count a 429).
        """
        limits = self._headers.parse(raw_headers(response))
        for kind, seen in limits.items():
            pace = self.paces.get(kind)
            if pace is None:
                if not seen.limit:
                    continue
                pace = self.paces[kind] = Pace(per_minute=seen.limit, clock=self._clock, sleep=self._sleep)
                logger.info("pacing %s at %.0f a minute, from the provider's rate-limit headers", kind, pace.per_minute)
            pace.observe(limit=seen.limit, remaining=seen.remaining, mark=admission.marks.get(kind),
                         amount=admission.charge(kind) if counted else 0)
        return limits

    def rate_limited(self, failure: Failure, admission: Admission, *, limits: dict[Kind, KindLimit]) -> None:
        """A quota 429 slows every caller; a capacity 429 is its request's alone, unless they are most answers."""
        response = failure.response
        assert response is not None
        exhausted = quota_evidence(
            limits=limits, charge={"requests": 1, "tokens": admission.tokens}, code=error_code(response),
            message=failure.detail,
        )
        if exhausted is None:
            if self._capacity.record(limited=True) and self.limiter.record_rate_limit(
                admission.permit, floor=self._capacity_floor, factor=CAPACITY_DECREASE
            ):
                logger.warning("most answers are HTTP 429: concurrency limit lowered to %d of %d",
                               self.limiter.limit, self.limiter.ceiling)
            return
        paces = {kind: pace for kind, pace in self.paces.items() if not exhausted or kind in exhausted}
        for kind, pace in paces.items():
            if pace.back_off(admission.marks.get(kind)):
                logger.warning("HTTP 429, quota of %s: pace lowered to %.0f a minute", kind, pace.per_minute)
        if not paces and self.limiter.record_rate_limit(admission.permit):
            logger.warning("HTTP 429, quota: concurrency limit lowered to %d of %d",
                           self.limiter.limit, self.limiter.ceiling)
        wait = server_retry_after(failure.headers, max_retry_after=self._max_retry_after)
        if wait is None:
            resets = [seen.reset for kind, seen in limits.items() if not exhausted or kind in exhausted]
            wait = min(max((r for r in resets if r is not None), default=0.0), self._max_retry_after)
        if wait > 0:
            self.pause.pause_for(wait)
