"""The retry rules, as tables: which statuses retry, which waits are honoured, how backoff grows."""

from __future__ import annotations

import email.utils
import random

import pytest

from llm_dispatch.core._exceptions import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
    APIStatusError,
    status_error_class,
)
from llm_dispatch.core._retry import (
    DEFAULT_MAX_RETRY_AFTER,
    backoff_delay,
    parse_retry_after,
    retry_delay,
    server_retry_after,
    should_retry_status,
)

NOW = 1_700_000_000.0  # a fixed Unix time for HTTP-date headers


def no_jitter() -> float:
    return 0.0


# Each status, whether it is retried, and the error it raises.
STATUSES = [
    *((status, False, error) for status, error in ((400, BadRequestError), (401, AuthenticationError),
                                                    (403, PermissionDeniedError), (404, NotFoundError),
                                                    (422, UnprocessableEntityError))),
    (408, True, APIStatusError), (409, True, ConflictError), (429, True, RateLimitError),
    *((status, True, InternalServerError) for status in (500, 502, 503, 504)),
]


@pytest.mark.parametrize(("status", "retried", "error_class"), STATUSES)
def test_status_rule(status: int, retried: bool, error_class: type[APIStatusError]) -> None:
    assert should_retry_status(status) is retried
    assert should_retry_status(status, {}) is retried
    assert status_error_class(status) is error_class
    # The exception's own flag agrees with the policy when the server says nothing.
    assert error_class("x", status_code=status).retryable is retried


@pytest.mark.parametrize(
    ("status", "header", "retried"),
    [
        (400, "true", True),
        (401, "true", True),
        (500, "false", False),
        (429, "false", False),
        (503, "FALSE", False),
        (404, " True ", True),
        # Anything but true/false leaves the status rule in charge.
        (400, "maybe", False),
        (500, "", True),
    ],
)
def test_x_should_retry_overrides_status(status: int, header: str, retried: bool) -> None:
    assert should_retry_status(status, {"x-should-retry": header}) is retried


def http_date(offset: float) -> str:
    return email.utils.formatdate(NOW + offset, usegmt=True)


BACKOFF_FIRST = 0.5  # what retry_delay falls back to for the first retry without jitter

HEADER_FORMS = [
    pytest.param({"retry-after-ms": "1500"}, 1.5, id="retry-after-ms"),
    pytest.param({"retry-after-ms": "250", "retry-after": "7"}, 0.25, id="ms-wins-over-seconds"),
    pytest.param({"retry-after": "3"}, 3.0, id="retry-after-seconds"),
    pytest.param({"retry-after": "2.5"}, 2.5, id="retry-after-float"),
    pytest.param({"Retry-After": "4"}, 4.0, id="header-name-case"),
    pytest.param({"retry-after": http_date(30)}, 30.0, id="retry-after-http-date"),
    pytest.param({"retry-after": "120"}, 120.0, id="at-the-cap"),
    pytest.param({"retry-after-ms": "soon", "retry-after": "4"}, 4.0, id="garbage-ms-falls-to-seconds"),
    pytest.param({"retry-after": "121"}, BACKOFF_FIRST, id="over-the-cap"),
    pytest.param({"retry-after-ms": "600000"}, BACKOFF_FIRST, id="ms-over-the-cap"),
    pytest.param({"retry-after": http_date(3600)}, BACKOFF_FIRST, id="date-over-the-cap"),
    pytest.param({"retry-after": http_date(-30)}, BACKOFF_FIRST, id="date-in-the-past"),
    pytest.param({"retry-after": "0"}, BACKOFF_FIRST, id="zero"),
    pytest.param({"retry-after": "-5"}, BACKOFF_FIRST, id="negative"),
    pytest.param({"retry-after-ms": "-100"}, BACKOFF_FIRST, id="negative-ms"),
    pytest.param({"retry-after": "soon"}, BACKOFF_FIRST, id="garbage"),
    pytest.param({"retry-after": "nan"}, BACKOFF_FIRST, id="nan"),
    pytest.param({"retry-after": "inf"}, BACKOFF_FIRST, id="infinity"),
    pytest.param({}, BACKOFF_FIRST, id="no-header"),
]


@pytest.mark.parametrize(("headers", "expected"), HEADER_FORMS)
def test_retry_delay_header_forms(headers: dict[str, str], expected: float) -> None:
    delay = retry_delay(retries_taken=0, headers=headers, random=no_jitter, now=NOW)
    assert delay == pytest.approx(expected)


def test_retry_after_cap_is_configurable() -> None:
    headers = {"retry-after": "30"}
    assert retry_delay(retries_taken=0, headers=headers, max_retry_after=60, random=no_jitter) == 30
    assert retry_delay(retries_taken=2, headers=headers, max_retry_after=10, random=no_jitter) == 2.0
    assert DEFAULT_MAX_RETRY_AFTER == 120


def test_parse_retry_after_reports_raw_value_and_server_retry_after_judges_it() -> None:
    assert parse_retry_after({"retry-after": "600"}) == 600
    assert server_retry_after({"retry-after": "600"}) is None
    assert parse_retry_after({"retry-after": "-1"}) == -1
    assert server_retry_after({"retry-after": "-1"}) is None
    assert parse_retry_after({"retry-after": "not a date"}) is None
    assert parse_retry_after(None) is None
    assert parse_retry_after({"retry-after": http_date(10)}, now=NOW) == pytest.approx(10)


@pytest.mark.parametrize(
    ("retries_taken", "base"),
    [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (50, 8.0), (10_000, 8.0)],
)
def test_backoff_bounds_with_jitter(retries_taken: int, base: float) -> None:
    assert backoff_delay(retries_taken, random=lambda: 0.0) == base
    assert backoff_delay(retries_taken, random=lambda: 1.0) == pytest.approx(base * 0.75)
    source = random.Random(retries_taken)
    for _ in range(200):
        assert base * 0.75 <= backoff_delay(retries_taken, random=source.random) <= base


def test_backoff_jitter_actually_varies() -> None:
    source = random.Random(7)
    delays = {backoff_delay(3, random=source.random) for _ in range(20)}
    assert len(delays) > 1


def test_retry_delay_backs_off_with_the_attempt_number() -> None:
    delays = [retry_delay(retries_taken=n, headers={"retry-after": "bogus"}, random=no_jitter) for n in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_retry_after_is_the_minimum_and_the_wait_grows_from_it() -> None:
    headers = {"retry-after": "1"}
    delays = [retry_delay(retries_taken=n, headers=headers, random=no_jitter) for n in range(6)]
    assert delays == pytest.approx([1.0, 1.05, 1.15, 1.35, 1.75, 2.55])
    source = random.Random(3)
    for n in range(6):
        # Each retry's band [R(1 + 0.05(2**n - 1)), that + 0.025 R) lies clear above the last one's.
        delay = retry_delay(retries_taken=n, headers=headers, random=source.random)
        assert 1 + 0.05 * (2**n - 1) <= delay < 1 + 0.05 * (2**n - 1) + 0.025


@pytest.mark.parametrize("seed", range(20))
def test_a_request_never_waits_the_same_interval_twice_in_a_row(seed: int) -> None:
    source = random.Random(seed)
    previous: float | None = None
    for n in range(8):  # below max_retry_after, where waits stop growing
        headers = source.choice([{}, {"retry-after": "1"}, {"retry-after-ms": "200"}, {"retry-after": "9"}])
        delay = retry_delay(retries_taken=n, headers=headers, previous=previous, random=source.random)
        if previous is not None:
            assert delay > previous
        assert delay >= (server_retry_after(headers) or 0)
        previous = delay


def test_past_the_cap_the_wait_still_grows() -> None:
    delays = []
    for n in range(7):
        delays.append(retry_delay(retries_taken=n, previous=delays[-1] if delays else None, random=no_jitter))
    assert delays == pytest.approx([0.5, 1, 2, 4, 8, 8.4, 8.82])
