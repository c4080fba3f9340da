"""The Prefect settings a command runs its flows under: the session's local server when one is up, room for a
temporary server to start, and the runs' ERROR lines left to the command (it says each error once)."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from ._common import _debug

EPHEMERAL_STARTUP_TIMEOUT = 120


@contextlib.contextmanager
def _prefect_settings() -> Any:
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    # With no Prefect server configured, Prefect starts a temporary one: 10-17 s on a fresh home,
    # more on a busy machine, past its default wait of 20 s. A user's own setting still wins.
    updates: dict[Any, Any] = {
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: max(
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), EPHEMERAL_STARTUP_TIMEOUT
        ),
    }
    if "PREFECT_SERVER_ANALYTICS_ENABLED" not in os.environ:
        # A temporary server's telemetry only logs an error on an offline machine.
        updates[PREFECT_SERVER_ANALYTICS_ENABLED] = False
    if not PREFECT_API_URL.value():
        from .server import running_server

        # No server configured: the one `llm-dispatch server start` keeps, when it is up, not a temporary one.
        local = running_server()
        if local is not None:
            updates[PREFECT_API_URL] = local.api_url
    with temporary_settings(updates=updates), _run_errors_unprinted(unless=_debug()):
        yield


class _RunErrors(logging.Filter):
    """Holds back the ERROR lines of flow and task runs: each is about an error that reaches the command, which
    says it once (one line, or the traceback of a bug). The Prefect API, and so the UI, still gets them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not record.name.startswith(("prefect.flow_runs", "prefect.task_runs"))


@contextlib.contextmanager
def _run_errors_unprinted(*, unless: bool) -> Any:
    """While a command runs a flow, Prefect's console shows no run's ERROR lines (``--debug``: it shows them all)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    consoles = [] if unless else [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    quiet = _RunErrors()
    for handler in consoles:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in consoles:
            handler.removeFilter(quiet)
