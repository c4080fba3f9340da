"""Names of task and flow runs in the Prefect UI, read from the run's parameters."""

from __future__ import annotations

from typing import Any


def parameter(name: str) -> Any:
    """A parameter of the task run being named (or, outside one, of the flow run)."""
    from prefect.runtime import flow_run, task_run

    parameters = task_run.parameters or flow_run.parameters
    return parameters.get(name)

