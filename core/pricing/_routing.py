"""Decides, per prompt, which lane it goes by (a plain request, a discounted lane, or the Batch API), and says why.

Urgency given on the prompt wins, then its deadline (the cheapest lane whose window, plus the margin, ends before
it), then the job's policy. Each decision carries a short human reason that is stored with the prompt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, get_args

from ._lanes import DEFAULT_OFFERS, LANE_PREFERENCE, LaneOffer
from .._params import shown
from .._status import Route, RoutePolicy

__all__ = [
    "DEFAULT_BATCH_WINDOW",
    "DEFAULT_MARGIN",
    "DEFAULT_URGENT_BELOW_CHARS",
    "URGENCIES",
    "RouteDecision",
    "RoutingRules",
    "Urgency",
    "decide_route",
    "format_duration",
    "format_timestamp",
    "parse_deadline",
    "prompt_chars",
]

Urgency = Literal["urgent", "bulk"]
URGENCIES: frozenset[str] = frozenset(get_args(Urgency))
POLICIES: frozenset[str] = frozenset(get_args(RoutePolicy))

DEFAULT_URGENT_BELOW_CHARS = 1000
# OpenAI's Batch API promises results within 24 hours.
DEFAULT_BATCH_WINDOW = timedelta(hours=24)
DEFAULT_MARGIN = timedelta(hours=1)
# Any deadline past the batch window routes the same; a longer duration is a typo, and one near year 9999
# would overflow when the prompt is recorded.
MAX_DEADLINE_DURATION = timedelta(days=36_525)

_BAD_DEADLINE = "{value} is not a timestamp or a duration like 2h, 30m, 1d"
# "90s", "30m", "2h", "1d", "1h30m": units largest first, each at most once.
_SHORT_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", re.IGNORECASE)
# ISO 8601 durations without years or months, whose length depends on the calendar: "PT2H", "P1DT12H".
_ISO_DURATION = re.compile(
    r"P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:[.,]\d+)?)S)?)?", re.IGNORECASE
)


def parse_deadline(value: str, *, now: datetime) -> datetime:
    """The deadline ``value`` means, as an aware UTC datetime.

    ``value`` is an ISO 8601 timestamp (with an offset, ``Z``, or naive meaning UTC) or a duration
    after ``now``: ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m`` or ISO ``PT2H``. Raises ``ValueError``.
    """
    _require_aware(now, name="now")
    text = value.strip()
    if not text:
        raise ValueError(_BAD_DEADLINE.format(value=shown(value)))
    try:
        duration = _duration(text)
        if duration is not None:
            if duration > MAX_DEADLINE_DURATION:
                raise ValueError(f"{shown(value)} is more than 100 years away; leave the deadline out for none")
            return now.astimezone(timezone.utc) + duration
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(_BAD_DEADLINE.format(value=shown(value))) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.astimezone(timezone.utc)
    except OverflowError as exc:
        raise ValueError(f"{shown(value)} is out of range for a deadline; give a date between years 1 and 9999") from exc


def _duration(text: str) -> timedelta | None:
    short = _SHORT_DURATION.fullmatch(text)
    if short and any(short.groups()):
        days, hours, minutes, seconds = (int(g or 0) for g in short.groups())
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    iso = _ISO_DURATION.fullmatch(text)
    if iso and any(iso.groups()) and not text.upper().endswith("T"):
        weeks, days, hours, minutes = (int(g or 0) for g in iso.groups()[:4])
        return timedelta(weeks=weeks, days=days, hours=hours, minutes=minutes,
                         seconds=float((iso.group(5) or "0").replace(",", ".")))
    return None


@dataclass(frozen=True, kw_only=True)
class RoutingRules:
    """How a job routes prompts that carry no urgency or deadline, and how deadlines are judged.

    ``policy="length"`` sends prompts shorter than ``urgent_below_chars`` real-time and the rest
    to the Batch API. A deadline earlier than ``batch_window + margin`` from now goes real-time.
    """

    policy: RoutePolicy = "length"
    urgent_below_chars: int = DEFAULT_URGENT_BELOW_CHARS
    batch_window: timedelta = DEFAULT_BATCH_WINDOW
    margin: timedelta = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"routing policy {self.policy!r} is unknown; use one of {', '.join(sorted(POLICIES))}")
        if isinstance(self.urgent_below_chars, bool) or not isinstance(self.urgent_below_chars, int) \
                or self.urgent_below_chars < 0:
            raise ValueError(f"urgent_below_chars must be a whole number >= 0, got {self.urgent_below_chars!r}")
        if not isinstance(self.batch_window, timedelta) or self.batch_window <= timedelta(0):
            raise ValueError(f"batch_window must be a positive timedelta (the Batch API's is 24h), got {self.batch_window!r}")
        if not isinstance(self.margin, timedelta) or self.margin < timedelta(0):
            raise ValueError(f"margin must be a timedelta >= 0, got {self.margin!r}")


@dataclass(frozen=True)
class RouteDecision:
    """Where one prompt goes, and a short reason a person can read in the results."""

    route: Route
    reason: str


def decide_route(
    *,
    urgency: str | None,
    deadline: datetime | None,
    prompt_chars: int,
    now: datetime,
    rules: RoutingRules,
    offers: Sequence[LaneOffer] = DEFAULT_OFFERS,
) -> RouteDecision:
    """Route one prompt: explicit urgency first, then its deadline, then ``rules.policy``.

    A deadline picks the cheapest of ``offers`` (the lanes the prompt's model and endpoint can take) whose window
    plus ``rules.margin`` from ``now`` ends by the deadline, ties broken by ``LANE_PREFERENCE``; none: real-time."""
    if urgency is not None:
        if urgency not in URGENCIES:
            raise ValueError(f"urgency {urgency!r} is unknown; use 'urgent' or 'bulk'")
        return RouteDecision("realtime" if urgency == "urgent" else "batch", f"urgency={urgency}")
    if deadline is not None:
        _require_aware(now, name="now")
        _require_aware(deadline, name="deadline")
        return _by_deadline(deadline=deadline, now=now, rules=rules, offers=offers)
    if rules.policy == "length":
        if prompt_chars < rules.urgent_below_chars:
            return RouteDecision("realtime", f"length {prompt_chars} < {rules.urgent_below_chars} chars")
        return RouteDecision("batch", f"length {prompt_chars} >= {rules.urgent_below_chars} chars")
    return RouteDecision("realtime" if rules.policy == "all-realtime" else "batch", f"policy {rules.policy}")


def _by_deadline(*, deadline: datetime, now: datetime, rules: RoutingRules, offers: Sequence[LaneOffer]) -> RouteDecision:
    margin = f"margin ({format_duration(rules.margin)})"

    def window(offer: LaneOffer) -> str:
        name = "the batch window" if offer.route == "batch" else offer.route
        return f"{name} ({format_duration(offer.window or rules.batch_window)})"

    fits = [offer for offer in offers if deadline >= now + (offer.window or rules.batch_window) + rules.margin]
    if not fits:
        lanes = ", ".join(window(offer) for offer in offers) or "the batch window"
        return RouteDecision("realtime", f"deadline {format_timestamp(deadline)} is before {lanes} + {margin}")
    best = min(fits, key=lambda offer: (-offer.discount, LANE_PREFERENCE.index(offer.route)))
    if best.route == "batch" and len(offers) == 1:
        return RouteDecision("batch", f"deadline {format_timestamp(deadline)} leaves room for {window(best)} + {margin}")
    return RouteDecision(best.route, f"deadline {format_timestamp(deadline)} leaves room for {window(best)} + {margin}: "
                                     f"the cheapest lane that does ({(best.discount * 100).normalize():f}% off)")


def prompt_chars(messages: Iterable[Mapping[str, Any]]) -> int:
    """Characters of text across all messages: string contents and the text parts of list contents."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, str):
                    total += len(part)
                elif isinstance(part, Mapping) and part.get("type") in ("text", "input_text"):
                    total += len(str(part.get("text") or ""))
    return total


def format_timestamp(moment: datetime) -> str:
    """``2026-11-21T20:00Z``: UTC, to the minute unless the seconds matter."""
    utc = moment.astimezone(timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ" if utc.second or utc.microsecond else "%Y-%m-%dT%H:%MZ")


def format_duration(delta: timedelta) -> str:
    """``24h``, ``1h30m``, ``90s`` -> ``1m30s``; ``0s`` for zero. Hours, not days: "24h" reads as the window."""
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _require_aware(moment: datetime, *, name: str) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime (e.g. datetime.now(timezone.utc))")
