"""``run_prompts`` / ``arun_prompts``: prompts from Python through the real dispatch flow and the bundled simulator,
each prompt's row back in input order with its answer as an instance of the Pydantic model given as the schema."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import BaseModel, Field, field_validator

from llm_dispatch import Row, arun_prompts, run_prompts
from llm_dispatch.core import ConfigError, InputError, PICO_PER_USD

from conftest import rows


class Person(BaseModel):
    name: str
    age: int
    nickname: str | None = None  # a default: still answered (strict mode asks for every property)


class Zed(BaseModel):
    """No answer the simulator makes follows it: a name that starts with Z."""

    name: str = Field(pattern="^Z")
    age: int


class Nobody(Person):
    @field_validator("name")
    @classmethod
    def never(cls, value: str) -> str:
        raise ValueError("no names today")


def prompt_costs(db_url: str) -> dict[str, Decimal]:
    return {custom_id: Decimal(cost) / PICO_PER_USD for custom_id, cost in rows(db_url, """
        SELECT p.custom_id, SUM(r.cost_pico_usd) FROM prompts p JOIN results r ON r.prompt_id = p.id
        GROUP BY p.custom_id""")}


def test_a_script_gets_model_instances_back_in_input_order(prefect_api: str, db_url: str) -> None:
    found = run_prompts(prompts=["Invent a person.",
                                 {"id": "fixed", "prompt": "Invent a person. [[sim:wrong_type]]",
                                  "metadata": {"source": "quiz"}},
                                 "Invent another person."],
                        schema=Person, simulate=True, sim_latency=0.01, route="all-realtime", database_url=db_url)
    assert [row.id for row in found] == ["line-1", "fixed", "line-3"]
    assert all(isinstance(row, Row) and row.status == "succeeded" and isinstance(row.parsed, Person)
               and row.violation is None for row in found)
    assert [row.reasks for row in found] == [0, 1, 0]  # the broken answer was asked again, and came back valid
    assert found[1].metadata == {"source": "quiz"} and found[1].answer is not None
    assert Person.model_validate_json(found[0].answer) == found[0].parsed
    # Each prompt's cost is what its rows cost, its re-ask included.
    assert {row.id: row.cost for row in found} == prompt_costs(db_url)
    assert found.job_id == rows(db_url, "SELECT id FROM jobs")[0][0]
    assert found.summary.report.structured.valid_after_reasks == 1


async def test_a_notebook_awaits_it_and_the_batch_lane_asks_again_in_a_follow_up_batch(prefect_api: str,
                                                                                         db_url: str) -> None:
    found = await arun_prompts(prompts=["Invent a person named Zoe.", "Invent a person. [[sim:missing_field]]"],
                               schema=Zed, simulate=True, sim_latency=0.01, route="all-batch", max_reasks=1,
                               database_url=db_url)
    for row in found:
        # Still invalid after its re-ask: no instance, the violation in words, both answers paid for.
        assert (row.status, row.parsed, row.reasks) == ("invalid", None, 1)
        assert "does not match '^Z'" in row.violation and row.cost and row.cost > 0
    assert rows(db_url, "SELECT request_total FROM batches ORDER BY id") == [(2,), (2,)]  # the second: a follow-up
    assert rows(db_url, "SELECT DISTINCT route FROM results") == [("batch",)]


async def test_run_prompts_in_a_running_event_loop_says_to_await_arun_prompts(db_url: str) -> None:
    with pytest.raises(ConfigError, match=r"write `await arun_prompts\(\.\.\.\)` with the same arguments"):
        run_prompts(prompts=["Invent a person."], schema=Person, simulate=True, database_url=db_url)


def test_a_model_s_own_validators_make_a_row_invalid(prefect_api: str, db_url: str) -> None:
    [row] = run_prompts(prompts=["Invent a person."], schema=Nobody, simulate=True, sim_latency=0.01,
                        route="all-realtime", database_url=db_url)
    # Its JSON Schema holds (stored succeeded, not asked again); the model's validator refuses it.
    assert (row.status, row.parsed, row.reasks) == ("invalid", None, 0)
    assert row.violation == "Nobody refuses it at name: Value error, no names today"
    assert rows(db_url, "SELECT status FROM prompts") == [("succeeded",)]


def test_a_prompt_that_is_neither_text_nor_a_dict_is_refused_before_anything_runs(db_url: str) -> None:
    with pytest.raises(InputError, match=r"^prompts\[1\]: a prompt is a text or a dict shaped like a .jsonl line, "
                                         r"got int$"):
        run_prompts(prompts=["Invent a person.", 7], schema=Person, simulate=True, database_url=db_url)
