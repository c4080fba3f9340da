"""A Prefect run's final state, made in one function for tasks and flows alike: ``Failed`` when its work has
failures left (so the UI, automations and alerts on failed runs see them), else ``Completed``, with a message that
says what and, for how a run stopped early, a name of its own. The run's result travels in the state either way."""

from __future__ import annotations

import logging
from typing import Any

from prefect import State
from prefect.states import Completed, Failed

from llm_dispatch.core import RunFailedError

__all__ = ["outcome_of", "result_of", "run_state"]

# A state message is read in a list of runs: longer ones are cut.
MAX_MESSAGE = 500
# The logger Prefect's task engine logs a task run's end with (and ships to the UI).
_TASK_RUNS_LOGGER = "prefect.task_runs"


def run_state(result: Any, *, failure: str | None = None, message: str = "", name: str | None = None) -> State:
    """The final state of a run that returns ``result``: ``Failed`` with ``failure`` as its message when there is
    one, else ``Completed`` with ``message``; ``name`` names it in the UI (a flow's ``BudgetReached``...).

    A failed run's result travels as a ``RunFailedError`` holding it (an exception as given), so a caller that
    awaits the flow itself gets that error, not Prefect's complaint that a summary is no exception. A caller
    reads ``result`` from a run called with ``return_state=True`` by ``result_of``, either way."""
    text = failure if failure is not None else message
    text = text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
    if failure is None:
        return Completed(message=text, data=result, name=name or None)
    _quiet_tracebacks_of_nothing()
    data = result if isinstance(result, BaseException) else RunFailedError(text, summary=result)
    return Failed(message=text, data=data, name=name or None)


async def result_of(state: State) -> Any:
    """What a run called with ``return_state=True`` returned, whether it ended ``Completed`` or ``Failed`` by
    ``run_state``; an exception it raised is raised here."""
    return outcome_of(await state.aresult(raise_on_failure=False))


def outcome_of(result: Any) -> Any:
    """A run's result as ``state.result(raise_on_failure=False)`` gave it: the summary of a run that failed in
    part (``RunFailedError``) or completed; any other exception raised."""
    if isinstance(result, RunFailedError):
        return result.summary
    if isinstance(result, BaseException):
        raise result
    return result


class _NoTracebackOfNothing(logging.Filter):
    """Drops the traceback of a record logged with ``exc_info=True`` while no exception was being handled.

    A task that returns a ``Failed`` state (rather than raising) is logged by Prefect's task engine as "Task run
    failed with state: Failed(...)" with ``exc_info=True`` and no exception, which every handler (the UI's
    included) would print as a traceback reading ``NoneType: None``. The line itself is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None and record.exc_info[0] is None:
            record.exc_info = None
        return True


def _quiet_tracebacks_of_nothing() -> None:
    """Put ``_NoTracebackOfNothing`` on Prefect's task-run logger, once per process (before a run returns a
    ``Failed`` state, in the process whose engine will log it)."""
    logger = logging.getLogger(_TASK_RUNS_LOGGER)
    if not any(isinstance(found, _NoTracebackOfNothing) for found in logger.filters):
        logger.addFilter(_NoTracebackOfNothing())
