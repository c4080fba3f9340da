"""Each prompt is routed real-time or batch by urgency, then deadline, then the job's policy, with a reason."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from llm_dispatch.core.pricing._routing import RouteDecision, RoutingRules, decide_route, parse_deadline, prompt_chars

NOW = datetime(2026, 11, 20, 18, 30, tzinfo=timezone.utc)
RULES = RoutingRules()
# Default batch window 24h + margin 1h.
BOUNDARY = NOW + timedelta(hours=25)


def route(*, urgency: str | None = None, deadline: datetime | None = None, chars: int = 57,
          rules: RoutingRules = RULES) -> RouteDecision:
    return decide_route(urgency=urgency, deadline=deadline, prompt_chars=chars, now=NOW, rules=rules)


@pytest.mark.parametrize(
    ("urgency", "deadline", "chars", "policy", "expected"),
    [
        # Urgency wins over everything else.
        ("urgent", NOW + timedelta(days=7), 50_000, "all-batch", RouteDecision("realtime", "urgency=urgent")),
        ("bulk", NOW + timedelta(minutes=5), 10, "all-realtime", RouteDecision("batch", "urgency=bulk")),
        # Then the deadline, over length and policy.
        (None, NOW + timedelta(hours=2), 50_000, "all-batch", RouteDecision(
            "realtime", "deadline 2026-11-20T20:30Z is before the batch window (24h) + margin (1h)")),
        (None, NOW + timedelta(days=3), 10, "all-realtime", RouteDecision(
            "batch", "deadline 2026-11-23T18:30Z leaves room for the batch window (24h) + margin (1h)")),
        # Then the policy.
        (None, None, 57, "length", RouteDecision("realtime", "length 57 < 1000 chars")),
        (None, None, 1000, "length", RouteDecision("batch", "length 1000 >= 1000 chars")),
        (None, None, 10, "all-batch", RouteDecision("batch", "policy all-batch")),
        (None, None, 50_000, "all-realtime", RouteDecision("realtime", "policy all-realtime")),
    ],
)
def test_routing_table(urgency: str | None, deadline: datetime | None, chars: int, policy: str,
                       expected: RouteDecision) -> None:
    assert route(urgency=urgency, deadline=deadline, chars=chars, rules=RoutingRules(policy=policy)) == expected  # type: ignore[arg-type]


def test_deadline_one_second_either_side_of_the_boundary() -> None:
    before = route(deadline=BOUNDARY - timedelta(seconds=1))
    at = route(deadline=BOUNDARY)
    after = route(deadline=BOUNDARY + timedelta(seconds=1))
    assert before == RouteDecision(
        "realtime", "deadline 2026-11-21T19:29:59Z is before the batch window (24h) + margin (1h)")
    assert at.route == "batch"
    assert after == RouteDecision(
        "batch", "deadline 2026-11-21T19:30:01Z leaves room for the batch window (24h) + margin (1h)")


def test_deadline_in_another_timezone_is_compared_in_utc() -> None:
    tokyo = timezone(timedelta(hours=9))
    decision = route(deadline=(BOUNDARY - timedelta(seconds=1)).astimezone(tokyo))
    assert decision.route == "realtime"
    assert "2026-11-21T19:29:59Z" in decision.reason


def test_custom_window_margin_and_threshold_show_in_reasons() -> None:
    rules = RoutingRules(urgent_below_chars=100, batch_window=timedelta(hours=12), margin=timedelta(minutes=90))
    assert route(chars=99, rules=rules) == RouteDecision("realtime", "length 99 < 100 chars")
    assert route(chars=100, rules=rules).route == "batch"
    decision = route(deadline=NOW + timedelta(hours=13), rules=rules)
    assert decision == RouteDecision(
        "realtime", "deadline 2026-11-21T07:30Z is before the batch window (12h) + margin (1h30m)")
    assert route(deadline=NOW + timedelta(hours=13, minutes=30), rules=rules).route == "batch"


def test_an_overdue_deadline_goes_realtime() -> None:
    assert route(deadline=NOW - timedelta(hours=1)).route == "realtime"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", NOW + timedelta(seconds=90)),
        ("30m", NOW + timedelta(minutes=30)),
        ("2h", NOW + timedelta(hours=2)),
        ("1d", NOW + timedelta(days=1)),
        ("1h30m", NOW + timedelta(hours=1, minutes=30)),
        ("1d2h3m4s", NOW + timedelta(days=1, hours=2, minutes=3, seconds=4)),
        (" 2H ", NOW + timedelta(hours=2)),
        ("PT2H", NOW + timedelta(hours=2)),
        ("PT1H30M", NOW + timedelta(hours=1, minutes=30)),
        ("P1DT12H", NOW + timedelta(days=1, hours=12)),
        ("P1W", NOW + timedelta(weeks=1)),
        ("PT0.5S", NOW + timedelta(seconds=0.5)),
    ],
)
def test_durations_count_from_now(text: str, expected: datetime) -> None:
    assert parse_deadline(text, now=NOW) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T20:00:00+00:00", datetime(2026, 11, 21, 20, 0, tzinfo=timezone.utc)),
        ("2026-11-21T20:00Z", datetime(2026, 11, 21, 20, 0, tzinfo=timezone.utc)),
        ("2026-11-21T21:00:00+01:00", datetime(2026, 11, 21, 20, 0, tzinfo=timezone.utc)),
        # Naive means UTC.
        ("2026-11-21T20:00:00", datetime(2026, 11, 21, 20, 0, tzinfo=timezone.utc)),
        ("2026-11-21", datetime(2026, 11, 21, tzinfo=timezone.utc)),
    ],
)
def test_timestamps_become_aware_utc(text: str, expected: datetime) -> None:
    parsed = parse_deadline(text, now=NOW)
    assert parsed == expected
    assert parsed.utcoffset() == timedelta(0)


@pytest.mark.parametrize("text", ["3 weeks-ish", "", "   ", "2 hours", "h", "PT", "P1DT", "P1M", "-2h", "2h30", "tomorrow"])
def test_bad_deadlines_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="is not a timestamp or a duration like 2h, 30m, 1d"):
        parse_deadline(text, now=NOW)


@pytest.mark.parametrize("text", ["99999999d", "2920000d", "36526d"])
def test_a_deadline_more_than_100_years_away_is_a_value_error(text: str) -> None:
    # 2920000d from 2026 is past year 9999: resolved when the prompt is recorded, it would not fit a datetime.
    with pytest.raises(ValueError, match="is more than 100 years away; leave the deadline out for none"):
        parse_deadline(text, now=NOW)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_deadline("2h", now=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        route(deadline=datetime(2026, 1, 1))


def test_unknown_urgency_is_refused() -> None:
    with pytest.raises(ValueError, match="use 'urgent' or 'bulk'"):
        route(urgency="asap")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "cheapest"}, "routing policy 'cheapest' is unknown; use one of all-batch, all-realtime, length"),
        ({"urgent_below_chars": -1}, "urgent_below_chars must be a whole number >= 0"),
        ({"urgent_below_chars": True}, "urgent_below_chars must be a whole number >= 0"),
        ({"batch_window": timedelta(0)}, "batch_window must be a positive timedelta"),
        ({"margin": timedelta(seconds=-1)}, "margin must be a timedelta >= 0"),
    ],
)
def test_bad_rules_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RoutingRules(**kwargs)  # type: ignore[arg-type]


def test_rules_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        RoutingRules("all-batch")  # type: ignore[misc]


def test_prompt_chars_counts_text_only() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "Describe"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a-very-long-url.png"}},
            {"type": "text", "text": " this."},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
    ]
    assert prompt_chars(messages) == len("Be brief.") + len("Describe") + len(" this.")
    assert prompt_chars([]) == 0
