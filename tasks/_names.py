"""Names of task and flow runs in the Prefect UI, read from the run's parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def parameter(name: str) -> Any:
    """A parameter of the task run being named (or, outside one, of the flow run)."""
    from prefect.runtime import flow_run, task_run

    parameters = task_run.parameters or flow_run.parameters
    return parameters.get(name)


def input_name(*, source: Any, job_id: Any) -> str:
    """What a run works on, in a few words: the input file's name, the job, or the prompts' count."""
    if isinstance(source, str):
        return Path(source).name
    if isinstance(source, (list, tuple)):
        return f"{len(source)} prompts"
    return f"job {job_id}" if job_id else "prompts"
