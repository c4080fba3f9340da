"""Hard deadlines for a client's attempts, all watched by one timer instead of one timer each.

``asyncio.timeout`` schedules and cancels an event-loop timer per use; a client making thousands of
attempts a second, nearly all of which end long before their deadline, needs only a periodic look
at those in flight. An attempt past its deadline is cancelled and ends in ``TimeoutError``, as under
``asyncio.timeout``, at most a tenth of its length late.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["SECONDS_PER_OUTPUT_TOKEN", "Deadlines", "attempt_deadline"]

# How long a generation may take per token of maximum output: Anthropic's SDK expects at most an hour for 128,000
# output tokens (``_calculate_nonstreaming_timeout``: 60 * 60 * max_tokens / 128_000, about 35.6 tokens a second).
SECONDS_PER_OUTPUT_TOKEN = 3600 / 128_000

# The longest wait between two looks: deadlines are seconds to minutes long.
MAX_RESOLUTION = 1.0
MIN_RESOLUTION = 0.001
# A deadline is looked at this many times over its length, at least.
LOOKS_PER_DEADLINE = 10


def attempt_deadline(*, max_output: int | None, floor: float) -> float:
    """Seconds one attempt of a request may take: ``floor`` (the request timeout), grown for a maximum output a
    generation needs longer for, at ``SECONDS_PER_OUTPUT_TOKEN`` (a 64,000-token cap: 1,800 s).

    Anthropic's SDK keeps a flat 600 s and refuses a non-streaming request whose cap says it may need more (over
    21,333 tokens); llm-dispatch does not stream, so it waits as long as the cap says instead.
    """
    if max_output is None or max_output <= 0:
        return floor
    return max(floor, max_output * SECONDS_PER_OUTPUT_TOKEN)


class Deadlines:
    """The deadlines of one client's attempts: ``async with deadlines.within(seconds) as deadline:``.

    While any attempt is in flight, one timer fires every ``resolution`` seconds (a tenth of the
    shortest deadline in flight, at most ``MAX_RESOLUTION``) and cancels the attempts whose deadline
    has passed; with none in flight there is no timer. A look goes over the attempts in flight, which
    the client's concurrency limit bounds.
    """

    def __init__(self) -> None:
        self.resolution = MAX_RESOLUTION
        self._open: dict[_Deadline, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def within(self, seconds: float) -> _Deadline:
        """A context for one attempt of at most ``seconds``; its ``expired()`` says whether it ran out."""
        if seconds <= 0:
            raise ValueError(f"a deadline must be positive, got {seconds}")
        return _Deadline(self, seconds)

    def _watch(self, deadline: _Deadline, seconds: float, loop: asyncio.AbstractEventLoop) -> None:
        self._open[deadline] = None
        finer = max(MIN_RESOLUTION, seconds / LOOKS_PER_DEADLINE)
        if finer < self.resolution:
            self.resolution = finer
            self._stop()
        if self._timer is None or self._loop is not loop:
            # (A client used from a new event loop, as tests do, starts its own timer there.)
            self._stop()
            self._loop = loop
            self._timer = loop.call_later(self.resolution, self._look)

    def _unwatch(self, deadline: _Deadline) -> None:
        self._open.pop(deadline, None)

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        passed = [d for d in self._open if d.when <= now]
        for deadline in passed:
            del self._open[deadline]
            deadline.expire(loop)
        if not self._open:
            self._timer = None
            self.resolution = MAX_RESOLUTION
            return
        # The resolution follows the shortest deadline still in flight: one short call does not keep
        # a busy client's timer fine for the rest of its life.
        shortest = min(d.seconds for d in self._open)
        self.resolution = min(MAX_RESOLUTION, max(MIN_RESOLUTION, shortest / LOOKS_PER_DEADLINE))
        self._timer = loop.call_later(self.resolution, self._look)


class _Deadline:
    __slots__ = ("_owner", "seconds", "_task", "_cancelling", "_expired", "when")

    def __init__(self, owner: Deadlines, seconds: float) -> None:
        self._owner = owner
        self.seconds = seconds
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._expired = False
        self.when = 0.0

    def expired(self) -> bool:
        return self._expired

    def expire(self, loop: asyncio.AbstractEventLoop) -> None:
        task = self._task
        if task is not None and task.get_loop() is loop and not task.done():
            self._expired = True
            task.cancel()

    async def __aenter__(self) -> _Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline is used inside a task")
        loop = task.get_loop()
        self._task = task
        self._cancelling = task.cancelling()
        self.when = loop.time() + self.seconds
        self._owner._watch(self, self.seconds, loop)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._owner._unwatch(self)
        if not self._expired:
            return
        assert self._task is not None
        # As asyncio.timeout: our own cancellation becomes TimeoutError, anyone else's goes on.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"the {self.seconds:g}s deadline passed") from exc
