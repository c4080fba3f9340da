"""The provider's rate-limit headers, read in each form they come in, and the quota-or-capacity decision on a 429."""

from __future__ import annotations

import httpx
import pytest

from llm_dispatch.core.wire._ratelimit_headers import (
    OPENAI_RATE_LIMIT_HEADERS,
    KindLimit,
    RateLimitHeaders,
    parse_reset,
    quota_evidence,
)

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param("6m0s", 360.0, id="minutes-and-seconds"),
        pytest.param("20ms", 0.02, id="milliseconds"),
        pytest.param("1.5s", 1.5, id="fractional-seconds"),
        pytest.param("1m30.5s", 90.5, id="minutes-and-fractional-seconds"),
        pytest.param("1h2m3s", 3723.0, id="hours"),
        pytest.param("2023-11-14T22:13:50Z", 30.0, id="rfc3339-utc"),
        pytest.param("2023-11-14T23:14:20.5+01:00", 60.5, id="rfc3339-offset"),
        pytest.param("12", 12.0, id="plain-seconds"),
        pytest.param("0.25", 0.25, id="plain-fractional-seconds"),
        pytest.param("2023-11-14T22:13:00Z", 0.0, id="past-is-now"),
    ],
)
def test_parse_reset_reads_each_form(value: str, seconds: float) -> None:
    assert parse_reset(value, now=NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [None, "", "soon", "5x", "m5s", "2023-11-14T22:13:50", "nan", "inf", "1s2"])
def test_parse_reset_refuses_what_it_cannot_read(value: str | None) -> None:
    assert parse_reset(value, now=NOW) is None


def test_openai_headers_give_each_kind() -> None:
    headers = httpx.Headers({
        "x-ratelimit-limit-requests": "10000", "x-ratelimit-remaining-requests": "9999",
        "x-ratelimit-reset-requests": "6ms", "x-ratelimit-limit-tokens": "2000000",
        "x-ratelimit-remaining-tokens": "1999000", "x-ratelimit-reset-tokens": "30ms",
    })
    assert OPENAI_RATE_LIMIT_HEADERS.parse(headers) == {
        "requests": KindLimit(limit=10000, remaining=9999, reset=0.006),
        "tokens": KindLimit(limit=2_000_000, remaining=1_999_000, reset=0.03),
    }
    assert OPENAI_RATE_LIMIT_HEADERS.parse({}) == {}


def test_another_provider_is_one_set_of_templates() -> None:
    anthropic = RateLimitHeaders(limit="anthropic-ratelimit-{kind}-limit",
                                 remaining="anthropic-ratelimit-{kind}-remaining",
                                 reset="anthropic-ratelimit-{kind}-reset")
    headers = {"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "0",
               "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:21Z"}
    assert anthropic.parse(headers, now=NOW) == {"requests": KindLimit(limit=50, remaining=0, reset=1.0)}


QUOTA_MESSAGE = ("Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, "
                 "Used 29800, Requested 500. Please try again in 600ms.")


@pytest.mark.parametrize(
    ("limits", "code", "message", "expected"),
    [
        pytest.param({"requests": KindLimit(100, 0, 0.5)}, "rate_limit_exceeded", "", {"requests"},
                     id="requests-remaining-0"),
        pytest.param({"tokens": KindLimit(30_000, 200, 0.6)}, None, "", {"tokens"},
                     id="tokens-left-below-the-request"),
        pytest.param({}, "rate_limit_exceeded", QUOTA_MESSAGE, {"tokens"}, id="quota-message"),
        pytest.param({}, "insufficient_quota", "You exceeded your current quota.", set(), id="insufficient-quota"),
        pytest.param({"requests": KindLimit(100, 40, 0.5)}, "rate_limit_exceeded",
                     "The model is overloaded; retry later.", None, id="capacity-with-room-left"),
        pytest.param({}, None, "Too Many Requests", None, id="capacity-bare"),
    ],
)
def test_quota_or_capacity(limits: dict, code: str | None, message: str, expected: set[str] | None) -> None:
    charge = {"requests": 1, "tokens": 500}
    assert quota_evidence(limits=limits, charge=charge, code=code, message=message) == expected
