"""A run's options are declared once (``core.RUN_OPTIONS``) and every door takes what the declaration gives it: the
``run`` command (its parameters, and the flags and help a user sees), ``run_prompts`` / ``arun_prompts``, the
``dispatch``, ``realtime-dispatch`` and ``dispatch-directory`` flows (their signatures, and the parameter schema
Prefect builds from them), and the parameters ``dispatch`` hands each real-time shard. A parameter missing or extra,
another default or another type at any door fails here."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, get_type_hints
from uuid import uuid4

import pytest
import typer.main
from pydantic import SecretStr

from llm_dispatch import arun_prompts, run_prompts
from llm_dispatch.cli.main import app, run
from llm_dispatch.core import (
    RUN_OPTIONS,
    Settings,
    door_parameters,
    run_option,
    setting_overrides,
    shard_parameters,
)
from llm_dispatch.core._run_options import REQUIRED, Door

from conftest import Sim, rows, write_prompts

FLOW_DOORS: tuple[Door, ...] = ("dispatch", "realtime", "directory")


def _flow(door: Door) -> Any:
    if door == "dispatch":
        from llm_dispatch.flows.dispatch import dispatch

        return dispatch
    if door == "directory":
        from llm_dispatch.flows.dispatch import dispatch_directory

        return dispatch_directory
    from llm_dispatch.flows.realtime import realtime_dispatch

    return realtime_dispatch


def _function(door: Door) -> Any:
    return {"cli": lambda: run, "python": lambda: arun_prompts}.get(door, lambda: _flow(door).fn)()


def _plain(hint: Any) -> Any:
    """``hint`` with its type variables as ``Any`` (``type[M] | None`` is ``type[Any] | None``)."""
    parameters = getattr(hint, "__parameters__", ())
    return hint[tuple(Any for _ in parameters)] if parameters and all(isinstance(p, TypeVar) for p in parameters) \
        else hint


def _taken(function: Any) -> dict[str, tuple[Any, Any]]:
    """Each parameter of ``function``: its type (``Annotated`` stripped) and default."""
    hints = get_type_hints(function)
    return {name: (_plain(hints[name]), parameter.default)
            for name, parameter in inspect.signature(function).parameters.items()}


@pytest.mark.parametrize("door", ["cli", "python", *FLOW_DOORS])
def test_each_door_takes_the_declared_options_with_their_types_and_defaults(door: Door) -> None:
    declared = {name: (taken.type, taken.default) for name, taken in door_parameters(door).items()}
    given = _taken(_function(door))
    assert sorted(set(given) - set(declared)) == [], f"{door} takes parameters the declaration does not give it"
    assert sorted(set(declared) - set(given)) == [], f"{door} lacks parameters the declaration gives it"
    differ = {name: {"declared": declared[name], "taken": given[name]} for name in declared
              if declared[name] != given[name]}
    assert differ == {}, f"{door} takes these with another type or default"


def test_every_python_keyword_is_keyword_only_and_run_prompts_takes_the_same() -> None:
    parameters = inspect.signature(arun_prompts).parameters
    assert {parameter.kind for parameter in parameters.values()} == {inspect.Parameter.KEYWORD_ONLY}
    assert inspect.signature(run_prompts).parameters == parameters
    assert [name for name, parameter in parameters.items() if parameter.default is REQUIRED] == ["prompts"]


def test_the_run_command_shows_each_option_with_its_declared_flags_help_and_default() -> None:
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    shown = {param.name: param for param in command.params}
    declared = door_parameters("cli")
    assert list(shown) == list(declared), "the command lists its options in the declaration's order"
    for name, taken in declared.items():
        param = shown[name]
        flags = [flag for declared_flags in taken.option.flags for flag in declared_flags.split("/")]
        if isinstance(param, typer.core.TyperArgument):
            assert name == "file" and param.required is False
        else:
            assert [*param.opts, *param.secondary_opts] == (flags or [f"--{name.replace('_', '-')}"]), name
        assert (param.help, param.default) == (taken.help, taken.default), name  # type: ignore[attr-defined]


@pytest.mark.parametrize("door", FLOW_DOORS)
def test_prefect_builds_each_flows_parameter_schema_from_the_declared_options(door: Door) -> None:
    schema = _flow(door).parameters
    declared = door_parameters(door)
    assert list(schema.properties) == list(inspect.signature(_flow(door).fn).parameters)
    required = [name for name, taken in declared.items() if taken.default is REQUIRED]
    assert set(schema.properties) == set(declared) and schema.required == required
    defaults = {name: schema.properties[name].get("default") for name in declared if name not in required}
    assert defaults == {name: taken.default for name, taken in declared.items() if name not in required}


def test_every_option_that_overrides_a_setting_names_a_field_of_settings_and_its_environment_variable() -> None:
    fields = Settings.model_fields
    assert [option.name for option in RUN_OPTIONS if option.setting and option.setting not in fields] == []
    for option in RUN_OPTIONS:
        if option.setting is not None:
            alias = fields[option.setting].validation_alias
            assert alias is None or option.env in alias.choices, option.name  # type: ignore[union-attr]
    assert run_option("budget").env == "LLM_DISPATCH_BUDGET"


def test_a_doors_values_become_the_settings_they_override_under_the_settings_names() -> None:
    values = {name: None for name in door_parameters("cli")} | {
        "route": "all-batch", "schema": "answer.json", "prices_file": Path("mine.json"), "resume": "job-1",
        "dedupe": False}
    overrides = setting_overrides(values, door="cli")
    assert {key: value for key, value in overrides.items() if value is not None} == {
        "route_policy": "all-batch", "response_schema": "answer.json", "prices_file": "mine.json", "dedupe": False}
    with pytest.raises(KeyError):  # a door's values lack one of its options
        setting_overrides({"model": "m"}, door="realtime")


def test_a_shard_gets_every_setting_of_its_parents_run_but_the_database_url() -> None:
    settings = Settings(model="gpt-4o-mini", endpoint="responses", prices_file="mine.json", concurrency=7,
                        budget_name="team", response_schema={"type": "object"}, max_reasks=4, dedupe=False,
                        base_url="http://127.0.0.1:9/v1", database_url="sqlite+aiosqlite:///secret.db")
    given = shard_parameters(settings, job_id="j", job_name="questions.jsonl", planned_route="realtime",
                             shards=4, shard=1, retry_failed="all")
    realtime = door_parameters("realtime")
    assert set(given) == set(door_parameters("shard")) and set(given) <= set(realtime)
    settings_taken = {taken.name for taken in realtime.values() if taken.option.setting}
    assert set(given) >= settings_taken - {"database_url"} and "database_url" not in given
    assert (given["prices_file"], given["endpoint"], given["answer_schema"], given["dedupe"], given["concurrency"]) \
        == ("mine.json", "responses", {"type": "object"}, False, 7)
    with pytest.raises(TypeError, match="shard"):
        shard_parameters(settings, job_id="j", job_name="q", planned_route="realtime", shards=4, retry_failed="all")


@pytest.mark.prefect
async def test_dispatch_hands_each_shard_parameters_realtime_dispatch_accepts(
    prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.deployments
    from prefect import flow
    from prefect.states import Completed

    from llm_dispatch.flows.dispatch import run_shards
    from llm_dispatch.flows.realtime import realtime_dispatch

    given: list[dict[str, Any]] = []

    async def run_deployment(name: str, *, parameters: dict[str, Any], timeout: float | None) -> Any:
        given.append(parameters)
        return SimpleNamespace(name=f"shard {parameters['shard']}", id=uuid4(), state=Completed())

    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment, raising=False)
    settings = Settings(prices_file="mine.json", endpoint="embeddings", concurrency=3)

    @flow
    async def parent() -> Any:
        return await run_shards(job_id="j", settings=settings, shards=2, deployment="realtime-dispatch/realtime",
                                retry_failed="none", label="questions.jsonl")

    shards = await parent()
    assert len(shards.flow_run_ids) == 2 and [p["shard"] for p in given] == [0, 1]
    for parameters in given:
        json.dumps(parameters)  # as the Prefect API takes them
        checked = realtime_dispatch.validate_parameters(parameters)
        assert (checked["prices_file"], checked["endpoint"], checked["concurrency"], checked["shards"]) \
            == ("mine.json", "embeddings", 3, 2)


@pytest.mark.prefect
async def test_realtime_dispatch_takes_the_endpoint_and_price_file_a_run_takes(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"prices_as_of": "2026-06-01", "models": {
        "gpt-6-luna": {"input": 1.0, "cached_input": 0.1, "cache_write": 1.25, "output": 5.0}}}), encoding="utf-8")
    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(3)])
    await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=SecretStr(db_url),
                            endpoint="responses", prices_file=str(prices))
    assert rows(db_url, "SELECT DISTINCT p.endpoint, r.prices_file, r.prices_as_of FROM prompts p "
                        "JOIN results r ON r.prompt_id = p.id") == [("responses", str(prices), "2026-06-01")]
