"""A Prefect run's final state, made in one function for tasks and flows alike: ``Failed`` when its work has
failures left (so the UI, automations and alerts on failed runs see them), else ``Completed``, with a message that
says what and, for how a run stopped early, a name of its own. The run's result travels in the state either way."""

from __future__ import annotations

from typing import Any

from prefect.states import Completed, Failed, State

__all__ = ["result_of", "run_state"]

# A state message is read in a list of runs: longer ones are cut.
MAX_MESSAGE = 500


def run_state(result: Any, *, failure: str | None = None, message: str = "", name: str | None = None) -> State:
    """The final state of a run that returns ``result``: ``Failed`` with ``failure`` as its message when there is
    one, else ``Completed`` with ``message``; ``name`` names it in the UI (a flow's ``BudgetReached``...).

    A caller reads ``result`` from a run called with ``return_state=True`` by ``result_of``."""
    text = failure if failure is not None else message
    text = text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
    make = Failed if failure is not None else Completed
    return make(message=text, data=result, **({"name": name} if name else {}))


async def result_of(state: State) -> Any:
    """What a run called with ``return_state=True`` returned, whether it ended ``Completed`` or ``Failed`` by
    ``run_state``; an exception it raised is raised here."""
    result = await state.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        raise result
    return result
