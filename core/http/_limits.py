"""Limits shared by every caller of one client: an adaptive concurrency cap, a shared pause, RPM/TPM buckets,
and the pace the provider's own rate-limit headers set.

The rule for a 429 (decided by ``bench/ratelimits.py``; figures are its medians of 3 runs on 2 cores):

- A **quota 429** (``_ratelimit_headers.quota_evidence``: the answer's headers leave nothing of a kind for the
  request, or the error names a quota) says the account is spent: every new attempt waits for the Retry-After
  (else the kind's reset), and that kind's :class:`Pace` drops to ``QUOTA_DECREASE``, then grows back by
  ``QUOTA_RECOVERY_PER_S`` of the limit a second. With no pace to lower (a provider that sends no headers) the
  concurrency cap halves instead, floor 1. Pacing so with nothing configured held a TPM quota at 0.94x
  (0.5% of requests answered 429) and an RPM quota at 0.93x (0.2%); a pace at 0.7x growing 5%/s held less.
- A **capacity 429** (no such evidence: a busy host, Azure's capacity 429s) retries that one request after its
  Retry-After and slows no one else. Only when they are the majority, at least ``CAPACITY_SHARE`` of the last
  ``CAPACITY_WINDOW`` answers, does the concurrency cap drop by a quarter, and never below a quarter of its
  ceiling. Random 429s at 20% never reach that share: the highest share over 100 consecutive answers was 31%
  in a 5,000-prompt run, so the client kept its full concurrency and sent at 0.99x the per-request-retry
  baseline, where halving on every 429 had held it to 1-2 in flight (8 prompts/s against 368).
- Runs sharing one account need no limiter of their own: each answer's ``remaining`` already counts the other
  runs' requests. Had a run been alone, the account would have had its window (the most it ever reported left,
  the request counted) less the run's own requests of the window's span left; the gap is what the others spent.
  Its rate, smoothed over ``OTHERS_SMOOTHING_S``, caps the pace at the ceiling less the others' rate (never below
  ``QUOTA_FLOOR`` of the ceiling). Two runs on one 100/s quota with 1 s windows held it at 0.92x together, with
  4.9% of requests answered 429 (the baseline: 67%); with the gap only pulling the pace's balance down, 0.91x
  and 6.2%. Alone, a run sees no others: RPM 0.94x (0.1% 429),
  TPM 0.93x (0.5%), sporadic 429s 1.00x the baseline.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "AdaptiveLimiter",
    "CapacityWatch",
    "Pace",
    "PaceMark",
    "Permit",
    "RateLimiter",
    "SharedPause",
]

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[object]]

# One extra slot per window of successes (``limit`` of them), as in TCP congestion avoidance: slow enough
# not to walk straight back into the 429. Recovering from a halving of 400 takes ~60,000 successes,
# minutes at hundreds of requests a second.
DEFAULT_ADDITIVE_INCREASE = 1.0
DEFAULT_DECREASE_FACTOR = 0.5
_EPSILON = 1e-9

# Just under the stated limit: sends spaced evenly at the full limit overflow a provider that counts its
# per-minute limit over a shorter window whenever scheduling bunches a few of them.
PACE_HEADROOM = 0.95
# The most a pace lets through at once, in seconds of its rate: small, so a quantised limit is never overrun.
PACE_BURST_S = 0.25
QUOTA_DECREASE = 0.8
QUOTA_FLOOR = 0.1  # of the ceiling: a pace lowered by a storm of quota 429s still probes the account
QUOTA_RECOVERY_PER_S = 0.1
# How quickly the estimate of what other runs spend follows the headers: a time constant, in seconds.
OTHERS_SMOOTHING_S = 2.0
CAPACITY_WINDOW = 100
CAPACITY_SHARE = 0.5
CAPACITY_DECREASE = 0.75


class Permit(NamedTuple):
    """One slot of an :class:`AdaptiveLimiter`; remembers the limit's generation when it was granted."""

    generation: int


class AdaptiveLimiter:
    """AIMD concurrency limit: halve on a 429 (floor 1), grow by about one slot per window of successes.

    ``acquire()`` takes one slot and ``release()`` gives it back. Report outcomes with :meth:`record_success` and
    :meth:`record_rate_limit`, passing the permit so that a burst of 429s from requests that were all
    in flight together halves the limit once, not once per request.
    """

    def __init__(
        self,
        *,
        ceiling: int,
        initial: int | None = None,
        floor: int = 1,
        increase: float = DEFAULT_ADDITIVE_INCREASE,
        decrease_factor: float = DEFAULT_DECREASE_FACTOR,
    ) -> None:
        if ceiling < 1 or floor < 1 or floor > ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got floor={floor}, ceiling={ceiling}")
        if not 0 < decrease_factor < 1:
            raise ValueError(f"decrease_factor must be between 0 and 1, got {decrease_factor}")
        self._ceiling = ceiling
        self._floor = floor
        self._increase = increase
        self._decrease_factor = decrease_factor
        # A float so that fractional additive increases accumulate; callers see its integer part.
        self._limit = float(min(max(initial if initial is not None else ceiling, floor), ceiling))
        self._in_flight = 0
        self._generation = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def __repr__(self) -> str:
        return f"AdaptiveLimiter(limit={self.limit}, ceiling={self._ceiling}, in_flight={self._in_flight})"

    @property
    def limit(self) -> int:
        """How many requests may be in flight right now."""
        return int(self._limit + _EPSILON)

    @property
    def ceiling(self) -> int:
        return self._ceiling

    @property
    def in_flight(self) -> int:
        """How many slots are held right now."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    def try_acquire(self) -> Permit | None:
        """A slot if one is free now and nobody waits for one (``acquire`` without awaiting), else None."""
        # First come, first served: a newcomer never overtakes a caller already waiting.
        if not self._waiters and self._in_flight < self.limit:
            self._in_flight += 1
            return Permit(self._generation)
        return None

    async def acquire(self) -> Permit:
        permit = self.try_acquire()
        if permit is not None:
            return permit
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as we were cancelled: give it to the next in line.
                self.release()
            else:
                self._waiters.remove(waiter)
            raise
        return Permit(self._generation)

    def release(self) -> None:
        if self._in_flight <= 0:
            raise RuntimeError("AdaptiveLimiter.release() called more often than acquire()")
        self._in_flight -= 1
        self._wake()

    def record_success(self, permit: Permit | None = None) -> None:
        """Additive increase: about one more slot after ``limit`` successes."""
        if self._limit < self._ceiling:
            # Divided by the whole-slot limit, so exactly ``limit`` successes buy the next slot.
            self._limit = min(float(self._ceiling), self._limit + self._increase / self.limit)
            self._wake()

    def record_rate_limit(
        self, permit: Permit | None = None, *, floor: int | None = None, factor: float | None = None
    ) -> bool:
        """Multiplicative decrease on a 429 (by ``factor``, default the limiter's, to no less than ``floor``).
        Returns whether the limit was lowered.

        A permit granted before the last decrease does not lower it again: its 429 belongs to the
        same overload the last decrease already answered.
        """
        if permit is not None and permit.generation != self._generation:
            return False
        self._generation += 1
        before = self.limit
        lowest = max(self._floor, floor or 0)
        lowered = float(int(self._limit * (factor or self._decrease_factor)))
        self._limit = max(float(min(lowest, before)), lowered)
        return self.limit < before

    def _wake(self) -> None:
        # Hand slots over directly (counting them as taken) so no newcomer can slip in between.
        while self._waiters and self._in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_flight += 1
                waiter.set_result(None)


class SharedPause:
    """A moment before which no new attempt starts; a 429's Retry-After moves it, for every caller."""

    def __init__(self, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self._until = float("-inf")

    def __repr__(self) -> str:
        return f"SharedPause(remaining={self.remaining:.3f})"

    def pause_for(self, seconds: float) -> None:
        """Hold new attempts for ``seconds`` from now; never shortens a pause already in force."""
        self._until = max(self._until, self._clock() + seconds)

    @property
    def deadline(self) -> float:
        """The clock reading at which the pause ends (``-inf`` if there never was one)."""
        return self._until

    @property
    def remaining(self) -> float:
        return max(0.0, self._until - self._clock())

    async def wait(self) -> float:
        """Sleep until the pause is over; returns the seconds slept."""
        slept = 0.0
        while True:
            until = self._until
            remaining = until - self._clock()
            if remaining <= 0:
                return slept
            await self._sleep(remaining)
            slept += remaining
            # Sleep again only if someone extended the pause meanwhile: a fake sleep that does not move
            # the clock must not turn this into a busy loop.
            if self._until <= until:
                return slept


class RateLimiter:
    """A token bucket for requests or tokens per minute: refills continuously, holds one minute's worth.

    The full-minute bucket matches how providers count (and the OpenAI cookbook's parallel processor):
    a fresh client may spend a minute's budget at once, then proceeds at the steady rate. An amount
    larger than the bucket waits for a full bucket and leaves it in debt rather than waiting forever.
    """

    def __init__(
        self,
        *,
        per_minute: float,
        burst: float | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if per_minute <= 0:
            raise ValueError(f"per_minute must be positive, got {per_minute}")
        self._rate = per_minute / 60.0
        self._capacity = float(burst if burst is not None else per_minute)
        self._clock = clock
        self._sleep = sleep
        self._level = self._capacity
        self._updated = clock()
        # FIFO: a large request cannot be starved by a stream of small ones.
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"RateLimiter(per_minute={self._rate * 60:g}, available={self.available:.1f})"

    @property
    def per_minute(self) -> float:
        return self._rate * 60

    @property
    def available(self) -> float:
        """What could be spent right now without waiting (negative while in debt)."""
        self._refill()
        return self._level

    async def acquire(self, amount: float = 1) -> float:
        """Wait until ``amount`` can be spent, then spend it. Returns the seconds waited."""
        waited = 0.0
        if amount <= 0:
            return waited
        async with self._lock:
            needed = min(amount, self._capacity)
            while True:
                self._refill()
                # The tolerance stops float rounding from asking for a sleep too short to move the clock.
                if self._level >= needed - _EPSILON:
                    break
                delay = (needed - self._level) / self._rate
                await self._sleep(delay)
                waited += delay
            self._level -= amount
        return waited

    def adjust(self, amount: float) -> None:
        """Charge ``amount`` more (or refund it, if negative) once the real cost is known."""
        self._refill()
        self._level = min(self._capacity, self._level - amount)

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._updated
        if elapsed > 0:
            self._level = min(self._capacity, self._level + elapsed * self._rate)
        self._updated = now


@dataclass(frozen=True, slots=True)
class PaceMark:
    """Where a :class:`Pace` stood when it let one request through: what it had spent, when, and its generation."""

    spent: float
    at: float
    generation: int


class Pace:
    """One kind of a provider's per-minute limit (requests or tokens), as its headers state it, sent evenly.

    The pace is ``PACE_HEADROOM`` of the stated limit, spaced evenly (a burst of at most ``PACE_BURST_S`` of it),
    and each answer's ``remaining`` pulls the pace's own balance down to what the account really has left: other
    runs on the same account spend from it too. What they spend a second, estimated from the same headers, comes
    off the pace. A quota 429 lowers the pace by ``QUOTA_DECREASE`` (once for the
    requests let through before it), which then grows back by ``QUOTA_RECOVERY_PER_S`` of the limit each second.
    """

    def __init__(self, *, per_minute: float, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        if per_minute <= 0:
            raise ValueError(f"per_minute must be positive, got {per_minute}")
        self._clock = clock
        self._sleep = sleep
        self._limit = float(per_minute)
        self._rate = self.ceiling
        # Empty at first: the answers that stated the limit were sent before there was any pace.
        self._level = 0.0
        self._updated = clock()
        self._spent = 0.0
        self._generation = 0
        self._lock = asyncio.Lock()
        # What the account counts at once (the most it ever reported left, with the request counted), what other
        # runs on it spend a second (smoothed), and when that was last estimated.
        self._window = 0.0
        self._others = 0.0
        self._others_at = clock()
        # (let through at, spent by then) for each request of the last window: ours among what the account counts.
        self._sent: collections.deque[tuple[float, float]] = collections.deque()
        self._spent_before_sent = 0.0

    def __repr__(self) -> str:
        return (f"Pace(per_minute={self._limit:g}, rate={self._rate * 60:.0f}/min, level={self._level:.1f}, "
                f"others={self._others * 60:.0f}/min)")

    @property
    def ceiling(self) -> float:
        """The fastest pace, per second: the headroom's share of the stated limit."""
        return self._limit * PACE_HEADROOM / 60.0

    @property
    def per_minute(self) -> float:
        """The pace now, per minute."""
        return self._rate * 60.0

    @property
    def others_per_minute(self) -> float:
        """What other runs on the same account spend, per minute, as this pace estimates it from the headers."""
        return self._others * 60.0

    @property
    def _share(self) -> float:
        """The fastest this pace may go, per second: the ceiling less what the others spend, never below the floor."""
        return max(self.ceiling * QUOTA_FLOOR, self.ceiling - self._others)

    async def acquire(self, amount: float = 1.0) -> PaceMark:
        """Wait until ``amount`` fits the pace, then spend it; an amount above the burst waits for a full one."""
        async with self._lock:
            while True:
                self._refill()
                needed = min(amount, self._burst)
                if self._level >= needed - _EPSILON:
                    break
                await self._sleep((needed - self._level) / self._rate)
            self._level -= amount
            mark = PaceMark(spent=self._spent, at=self._clock(), generation=self._generation)
            self._spent += amount
            self._sent.append((mark.at, self._spent))
            return mark

    def observe(self, *, limit: float | None, remaining: float | None, mark: PaceMark | None, amount: float) -> None:
        """An answer's headers for this kind; ``mark`` and ``amount`` are what its request took when it was let through."""
        self._refill()
        if limit is not None and limit > 0 and limit != self._limit:
            self._limit = limit
            self._rate = min(self._rate, self.ceiling)
        if remaining is None or mark is None:
            return
        # What the account had left when it counted this request, what our pace refilled since, less what we
        # spent since: anything above that was spent by someone else on the same account.
        spent_since = self._spent - mark.spent - amount
        balance = remaining + self._rate * (self._clock() - mark.at) - spent_since
        self._level = min(self._level, balance)
        if amount > 0:
            self._estimate_others(remaining=remaining, mark=mark, amount=amount)

    def _estimate_others(self, *, remaining: float, mark: PaceMark, amount: float) -> None:
        # The account counts a window of ``self._window`` over ``span`` seconds. Had we been alone it would have had
        # the window less our own requests in it left; the gap is what the others spent in that span.
        self._window = max(self._window, remaining + amount)
        span = self._window / (self._limit / 60.0)
        # Answers arrive well after their requests were let through: keep more than one window of them.
        while self._sent and self._sent[0][0] < self._clock() - 2 * span - 10.0:
            _, self._spent_before_sent = self._sent.popleft()
        ours = mark.spent + amount - self._spent_at(mark.at - span)
        others = max(0.0, self._window - remaining - ours) / span
        now = self._clock()
        weight = 1.0 - math.exp(-max(0.0, now - self._others_at) / OTHERS_SMOOTHING_S)
        self._others += (others - self._others) * weight
        self._others_at = now
        self._rate = min(self._rate, self._share)

    def _spent_at(self, moment: float) -> float:
        """What this pace had let through by ``moment``."""
        index = bisect.bisect_right(self._sent, moment, key=lambda sent: sent[0])
        return self._sent[index - 1][1] if index else self._spent_before_sent

    def back_off(self, mark: PaceMark | None) -> bool:
        """A quota 429 for this kind: lower the pace, once for everything let through before the last decrease."""
        # A request let through before this pace existed belongs to its first generation.
        if (mark.generation if mark is not None else 0) != self._generation:
            return False
        self._refill()
        self._generation += 1
        self._rate = max(self._rate * QUOTA_DECREASE, self.ceiling * QUOTA_FLOOR)
        return True

    @property
    def _burst(self) -> float:
        return max(1.0, self._rate * PACE_BURST_S)

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._updated
        if elapsed > 0:
            self._level = min(self._burst, self._level + elapsed * self._rate)
            self._rate = min(self._share, self._rate + self.ceiling * QUOTA_RECOVERY_PER_S * elapsed)
        self._updated = now


class CapacityWatch:
    """The share of capacity 429s among a client's recent answers, and whether it calls for fewer in flight.

    Only a share of at least ``CAPACITY_SHARE`` over the last ``CAPACITY_WINDOW`` answers does: sporadic 429s are
    the provider's noise, and each is retried alone.
    """

    def __init__(self, *, window: int = CAPACITY_WINDOW, share: float = CAPACITY_SHARE) -> None:
        self._outcomes: collections.deque[bool] = collections.deque(maxlen=window)
        self._share = share
        self._limited = 0

    def record(self, *, limited: bool) -> bool:
        """Count one answer; returns whether the recent share of capacity 429s is high enough to slow down."""
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen and outcomes[0]:
            self._limited -= 1
        outcomes.append(limited)
        self._limited += limited
        return limited and len(outcomes) == outcomes.maxlen and self._limited >= self._share * len(outcomes)
