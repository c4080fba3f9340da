"""Names of task and flow runs in the Prefect UI, read from the run's parameters."""

from __future__ import annotations

from typing import Any


def parameter(name: str) -> Any:
    """A parameter of the task run being named (or, outside one, of the flow run), as the task sees it."""
    from prefect.runtime import flow_run, task_run
    from prefect.utilities.annotations import BaseAnnotation

    value = (task_run.parameters or flow_run.parameters).get(name)
    # A parameter passed as quote(x) (to keep Prefect from walking it) is still x to the task.
    return value.unwrap() if isinstance(value, BaseAnnotation) else value


def prompts(count: int) -> str:
    from llm_dispatch.core import counted

    return counted(count, "prompt")

