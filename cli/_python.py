"""``llm-dispatch run`` from Python: a list of prompts (or a file) through the same ``dispatch`` flow, storage and
budget ledger, with each prompt's outcome back as a ``Row`` in input order, its answer parsed into the Pydantic
model given as the schema. ``arun_prompts`` in a running event loop (a notebook's), ``run_prompts`` elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from pydantic import ValidationError

from llm_dispatch.core import (
    ConfigError,
    Endpoint,
    InputError,
    RetryFailed,
    RoutePolicy,
    from_pico,
    pydantic_schema,
    setting_overrides,
)

from ._common import _settings
from ._flow_runs import check_simulated_wait, dispatch_summary, simulated

if TYPE_CHECKING:
    from llm_dispatch.jobs import DispatchSummary
    from llm_dispatch.storage import ExportRow

__all__ = ["Row", "Rows", "arun_prompts", "run_prompts"]

M = TypeVar("M")
P = ParamSpec("P")
T = TypeVar("T")
Prompts = str | os.PathLike[str] | Sequence[str | Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Row(Generic[M]):
    """One prompt's outcome, as stored.

    ``status``: ``succeeded``, ``invalid`` (its answer still breaks the schema after its re-asks, or the model's own
    validators refuse it), ``refused``, ``failed``, or ``pending`` / ``batched`` while unfinished. ``parsed``: the
    answer as an instance of the schema's model (without one, the JSON value a prompt's own ``response_format``
    asked for), else None. ``answer``: its last answer's text. ``violation``: what is wrong with that answer.
    ``reasks``: times it was asked again. ``cost``: what the prompt cost in dollars, its re-asks included (None:
    not priced or not answered)."""

    id: str
    status: str
    parsed: M | None
    answer: str | None
    violation: str | None
    error: str | None
    reasks: int
    cost: Decimal | None
    model: str
    metadata: dict[str, Any] | None


class Rows(list[Row[M]], Generic[M]):
    """A run's rows in input order, one per prompt (a list), with the job they belong to (``job_id``: the same
    prompts again resume it, nothing answered is paid again) and the run's ``summary`` (counts, cost, re-asks)."""

    def __init__(self, rows: Iterable[Row[M]], *, job_id: str, summary: DispatchSummary) -> None:
        super().__init__(rows)
        self.job_id = job_id
        self.summary = summary


async def arun_prompts(
    *,
    prompts: Prompts,
    schema: type[M] | None = None,
    model: str | None = None,
    allow_unknown_model: bool = False,
    simulate: bool = False,
    database_url: str | None = None,
    endpoint: Endpoint | None = None,
    route: RoutePolicy | None = None,
    max_reasks: int | None = None,
    cache_plan: bool | None = None,
    budget: float | None = None,
    budget_name: str | None = None,
    max_cost: float | None = None,
    concurrency: int | None = None,
    prices_file: str | os.PathLike[str] | None = None,
    providers_file: str | os.PathLike[str] | None = None,
    job_name: str | None = None,
    new_job: bool = False,
    retry_failed: RetryFailed = "retryable",
    wait: bool = True,
    sim_latency: float = 0.2,
) -> Rows[M]:
    """Send ``prompts`` as ``llm-dispatch run`` does (the ``dispatch`` flow) and return each prompt's ``Row``.

    ``prompts``: a .jsonl or .csv file's path, or a list whose items are prompt texts or dicts shaped like a .jsonl
    line (``{"id": ..., "prompt": ..., "metadata": ...}``). ``schema``: a Pydantic model class, every answer's
    schema (sent as strict structured output, checked, asked again up to ``max_reasks`` times when invalid), each
    valid answer returned as an instance of it. ``route``: ``length`` (default), ``all-realtime`` or ``all-batch``.
    ``endpoint``: the endpoint of prompts that name none (``chat``, the default, ``responses``, ``embeddings``).
    ``prices_file``: your own price table (JSON) over the bundled one, for the estimate, ``max_cost``, budgets and
    the costs stored.
    ``budget`` (dollars over the job's life) or ``budget_name`` (a shared budget) hold each request's worst case
    before it is sent; what does not fit stays ``pending``. ``simulate``: against the bundled simulator, in this
    process (no key, no network). The other settings come from the environment (``LLM_DISPATCH_*``), as for the
    command. Raises ``InputError``/``ConfigError`` (nothing sent) for bad prompts or settings, ``BudgetExceededError``
    for an estimate above ``max_cost``; failed prompts are rows, not errors.
    """
    given = dict(locals())
    check_simulated_wait(simulate=simulate, wait=wait)
    source = _source(prompts)
    given["schema"] = None if schema is None else pydantic_schema(schema)
    # Not given (False) leaves the environment's setting (LLM_DISPATCH_ALLOW_UNKNOWN_MODEL) standing.
    given["allow_unknown_model"] = allow_unknown_model or None
    settings = _settings(door="python", **setting_overrides(given, door="python"))
    with simulated(settings, latency=sim_latency) if simulate else contextlib.nullcontext(settings) as sending:
        summary = await dispatch_summary(source=source, job_id=None, settings=sending, wait=wait,
                                         max_cost=max_cost, retry_failed=retry_failed, new_job=new_job,
                                         job_name=job_name)
    job_id = summary.report.job_id
    return Rows(await _rows(settings.database_url, job_id=job_id, schema=schema), job_id=job_id, summary=summary)


def _in_a_loop_of_its_own(function: Callable[P, Coroutine[Any, Any, T]], *, name: str) -> Callable[P, T]:
    """``function`` as ``name``: run to its end in an event loop of its own, for a script; refused (with what to
    write instead) in a thread that already runs one, as a notebook's does."""

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(function(*args, **kwargs))
        raise ConfigError(f"{name} runs an event loop of its own and this thread already runs one (a notebook's): "
                          f"write `await {function.__name__}(...)` with the same arguments")

    run.__name__ = run.__qualname__ = name
    run.__doc__ = (f"``{function.__name__}`` for a script: the same keyword arguments, run to the end in an event "
                   f"loop of its own. In a running event loop (a Jupyter notebook's), ``await {function.__name__}(...)``"
                   " instead.")
    return run


run_prompts = _in_a_loop_of_its_own(arun_prompts, name="run_prompts")


def _source(prompts: Prompts) -> str | list[dict[str, Any]]:
    """The flow's ``prompts``: a file's path as a string, or each prompt as a dict (a text becomes ``prompt``)."""
    if isinstance(prompts, (str, os.PathLike)):
        path = os.fspath(prompts)
        if not os.path.isfile(path):
            raise InputError(f"prompts: no file {path!r}; give the path of a .jsonl or .csv file, or a list of "
                             "prompts (a single prompt too: [text])")
        return path
    records: list[dict[str, Any]] = []
    for index, item in enumerate(prompts):
        if isinstance(item, str):
            records.append({"prompt": item})
        elif isinstance(item, Mapping):
            records.append(dict(item))
        else:
            raise InputError(f"prompts[{index}]: a prompt is a text or a dict shaped like a .jsonl line, got "
                             f"{type(item).__name__}")
    return records


async def _rows(database_url: str, *, job_id: str, schema: type[M] | None) -> list[Row[M]]:
    from llm_dispatch import storage

    async with storage.open_database(database_url) as sessions:
        return [_row(found, schema=schema) async for found in storage.export_rows(sessions, job_id=job_id)]


def _row(found: ExportRow, *, schema: type[M] | None) -> Row[M]:
    parsed, status, violation = found.parsed, found.status, found.violation
    if schema is not None and parsed is not None:
        try:
            parsed = schema.model_validate(parsed)  # type: ignore[attr-defined]
        except ValidationError as exc:
            # Its JSON Schema holds, its own validators do not: invalid for this model (never asked again for it).
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "$"
            parsed, status, violation = None, "invalid", f"{schema.__name__} refuses it at {where}: {first['msg']}"
    cost = None if found.prompt_cost_pico_usd is None else from_pico(found.prompt_cost_pico_usd)
    return Row(id=found.custom_id, status=status, parsed=parsed, answer=found.text, violation=violation,
               error=found.error_message, reasks=found.reask or 0, cost=cost, model=found.model,
               metadata=found.metadata)
