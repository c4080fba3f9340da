"""Lanes shorter than the Batch API's 24 hours (issue 27, item 3): each prompt with a deadline goes by the cheapest
lane whose window ends before it (real-time, flex, a background completion window, the Batch API), the reason
stored with it, priced at that lane's discount from the catalog, and sent as the lane says over a real socket."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from llm_dispatch.cli.main import app
from llm_dispatch.core import ChatRequest, ConfigError, LLMClient, PriceTable, RoutingRules, decide_route
from llm_dispatch.core.pricing._catalog import parse_catalog

from conftest import cli, rows, write_prompts

NOW = datetime(2026, 11, 26, 15, 0, tzinfo=timezone.utc)
TABLE = PriceTable.load(on=NOW.date())


def lane_for(*, model: str, endpoint: str = "chat", hours: float) -> tuple[str, str]:
    decision = decide_route(urgency=None, deadline=NOW + timedelta(hours=hours), prompt_chars=10, now=NOW,
                            rules=RoutingRules(), offers=TABLE.lane_offers(model=model, endpoint=endpoint))
    return decision.route, decision.reason


@pytest.mark.parametrize(("model", "endpoint", "hours", "lane"), [
    # gpt-6-luna takes flex (50% off, a 15-minute window): the cheapest as soon as 15m + the 1h margin fit.
    ("gpt-6-luna", "chat", 1.0, "realtime"),
    ("gpt-6-luna", "chat", 1.25, "flex"),
    ("gpt-6-luna", "responses", 3, "flex"),  # flex's half price beats the 2h window's 30%
    ("gpt-6-luna", "chat", 30, "batch"),  # as cheap as flex: the Batch API holds no connection
    # gpt-5.5 has no flex tier: on the Responses API its background windows, then the Batch API.
    ("gpt-5.5", "responses", 2.9, "realtime"),
    ("gpt-5.5", "responses", 3, "background-2h"),
    ("gpt-5.5", "responses", 9, "background-8h"),
    ("gpt-5.5", "responses", 25, "batch"),
    ("gpt-5.5", "chat", 9, "realtime"),  # background mode is the Responses API's alone
    # Anthropic documents no lane shorter than its Message Batches' 24 h; embeddings have only the Batch API.
    ("claude-haiku-5-5", "chat", 9, "realtime"),
    ("text-embedding-3-small", "embeddings", 9, "realtime"),
    ("my-vllm-model", "chat", 30, "batch"),  # a model the catalog does not know keeps the Batch API
])
def test_a_deadline_takes_the_cheapest_lane_whose_window_and_margin_end_before_it(
    model: str, endpoint: str, hours: float, lane: str
) -> None:
    assert lane_for(model=model, endpoint=endpoint, hours=hours)[0] == lane


def test_the_reason_names_the_lane_its_window_and_its_discount() -> None:
    assert lane_for(model="gpt-5.5", endpoint="responses", hours=3)[1] == (
        "deadline 2026-11-26T18:00Z leaves room for background-2h (2h) + margin (1h): "
        "the cheapest lane that does (30% off)")
    assert lane_for(model="gpt-5.5", endpoint="responses", hours=2)[1] == (
        "deadline 2026-11-26T17:00Z is before background-2h (2h), background-8h (8h), the batch window (24h) "
        "+ margin (1h)")


def test_each_lanes_discount_comes_from_the_catalog_with_its_source() -> None:
    lanes = TABLE.lanes
    assert (lanes["background-2h"].discount, lanes["background-8h"].discount) == (Decimal("0.3"), Decimal("0.4"))
    assert lanes["background-2h"].source == "https://developers.openai.com/api/docs/guides/background"
    assert lanes["flex"].tier == "flex" and lanes["flex"].window == timedelta(minutes=15)
    assert lanes["flex"].source == "https://developers.openai.com/api/docs/guides/flex-processing"
    assert "anthropic" not in {lane.provider for lane in lanes.values()}


def test_the_models_command_lists_the_lanes_with_their_sources() -> None:
    shown = CliRunner().invoke(app, ["models", "--json"])
    assert shown.exit_code == 0, shown.output
    lanes = {lane["lane"]: lane for lane in json.loads(shown.output)["lanes"]}
    assert (lanes["background-8h"]["window"], lanes["background-8h"]["discount"]) == ("8h", 0.4)
    assert (lanes["flex"]["window"], lanes["flex"]["tier"]) == ("15m", "flex")
    assert all(lane["source"].startswith("https://developers.openai.com/") for lane in lanes.values())


# gpt-5.5: $5 in, $30 out per 1M tokens; 100,000 of each cost $3.50 at the standard price.
@pytest.mark.parametrize(("route", "service_tier", "cost", "discount"), [
    ("realtime", None, Decimal("3.5"), "0"),
    ("background-2h", None, Decimal("2.45"), "0.3"),
    ("background-8h", "default", Decimal("2.1"), "0.4"),
    ("batch", None, Decimal("1.75"), "0.5"),
])
def test_one_formula_prices_each_lane(route: str, service_tier: str | None, cost: Decimal, discount: str) -> None:
    charge = TABLE.price(model="gpt-5.5", route=route, prompt_tokens=100_000,  # type: ignore[arg-type]
                         completion_tokens=100_000, service_tier=service_tier)
    assert charge is not None and (charge.dollars, charge.list_dollars, charge.discount) == (cost, Decimal("3.5"),
                                                                                              discount)


def test_flex_bills_at_the_models_flex_tier_and_a_model_without_one_has_no_flex_price() -> None:
    # gpt-6-luna: $0.10 in, $0.50 out per 1M tokens; 100,000 of each cost $0.06 at the standard price.
    flex = TABLE.price(model="gpt-6-luna", route="flex", prompt_tokens=100_000, completion_tokens=100_000)
    assert flex is not None and (flex.dollars, flex.discount) == (Decimal("0.03"), "0.5")
    # An answer that says it was served at the standard tier is billed so.
    served = TABLE.price(model="gpt-6-luna", route="flex", prompt_tokens=100_000, completion_tokens=100_000,
                         service_tier="default")
    assert served is not None and (served.dollars, served.discount) == (Decimal("0.06"), "0")
    assert TABLE.price(model="gpt-5.5", route="flex", prompt_tokens=1, completion_tokens=1) is None


@pytest.mark.parametrize(("lanes", "message"), [
    ({"urgent": {}}, "field 'lanes.urgent' is no lane llm-dispatch sends"),
    ({"flex": {"provider": "openai", "endpoints": ["chat"], "window": "15m", "source": "x", "tier": "flex",
               "discount": 0.5}}, "needs one of 'discount'"),
    ({"background-2h": {"provider": "openai", "endpoints": ["responses"], "window": "soon", "source": "x",
                        "discount": 0.3}}, "field 'lanes.background-2h.window' must be a duration"),
    ({"background-2h": {"provider": "openai", "endpoints": ["responses"], "window": "2h", "discount": 0.3}},
     "field 'lanes.background-2h.source' is missing"),
])
def test_a_bad_lane_in_a_price_file_says_which_field(lanes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_catalog(json.dumps({"lanes": lanes}), where="p.json", complete=False)


async def test_each_lane_goes_out_as_it_says_over_a_real_socket(start_sim: Any) -> None:
    base_url = await start_sim(latency=0.0)
    ask = [{"role": "user", "content": "hello"}]
    async with LLMClient(base_url=base_url, api_key="sk-test", background_poll=0.05) as client:
        flex = await client.chat(ChatRequest(model="gpt-6-luna", messages=ask, lane="flex"))
        window = await client.chat(ChatRequest(model="gpt-5.5", messages=ask, endpoint="responses",
                                               lane="background-8h"))
        plain = await client.chat(ChatRequest(model="gpt-5.5", messages=ask, endpoint="responses"))
    assert (flex.service_tier, window.response_id[:5], plain.response_id[:5]) == ("flex", "resp_", "resp_")
    async with httpx.AsyncClient() as http:
        counted = (await http.get(base_url.removesuffix("/v1") + "/_sim/stats")).json()["by_status"]
    # The 8h window was created in background mode and polled; the plain request was not.
    assert counted["background_created"] == 1 and counted["background_window_8h"] == 1


async def test_the_simulator_refuses_a_window_it_does_not_know_or_without_background_mode(start_sim: Any) -> None:
    base_url = await start_sim(latency=0.0)
    body = {"model": "gpt-5.5", "input": "hi"}
    async with httpx.AsyncClient(headers={"Authorization": "Bearer sk-test"}) as http:
        unknown = await http.post(f"{base_url}/responses", json={
            **body, "background": True, "background_options": {"completion_window": "4h"}})
        foreground = await http.post(f"{base_url}/responses", json={
            **body, "background_options": {"completion_window": "2h"}})
    assert unknown.status_code == foreground.status_code == 400
    assert "'4h'" in unknown.json()["error"]["message"]
    assert "requires 'background' to be true" in foreground.json()["error"]["message"]


LANES = [
    {"id": "urgent", "prompt": "now", "model": "gpt-6-luna", "urgency": "urgent"},
    {"id": "flex", "prompt": "in two hours", "model": "gpt-6-luna", "deadline": "2h"},
    {"id": "window-2h", "prompt": "this afternoon", "model": "gpt-5.5", "endpoint": "responses", "deadline": "3h"},
    {"id": "window-8h", "prompt": "tomorrow morning", "model": "gpt-5.5", "endpoint": "responses", "deadline": "10h"},
    {"id": "bulk", "prompt": "whenever", "model": "gpt-5.5", "endpoint": "responses", "deadline": "3d"},
]


@pytest.mark.prefect
def test_a_run_sends_each_prompt_once_by_its_lane_and_stores_the_lanes_discount(
    cli_env: dict[str, str], sim: Any, db_url: str, tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "by-lane.jsonl", LANES)
    done = cli("run", str(path), "--json", env=cli_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = rows(db_url, "SELECT p.custom_id, p.planned_route, r.route, r.discount, r.service_tier, "
                          "r.cost_pico_usd * 1.0 / r.list_cost_pico_usd FROM prompts p "
                          "JOIN results r ON r.prompt_id = p.id ORDER BY p.position")
    assert [row[:5] for row in stored] == [
        ("urgent", "realtime", "realtime", "0", "default"),
        ("flex", "flex", "flex", "0.5", "flex"),
        ("window-2h", "background-2h", "background-2h", "0.3", "default"),
        ("window-8h", "background-8h", "background-8h", "0.4", "default"),
        ("bulk", "batch", "batch", "0.5", "default"),
    ]
    assert [round(row[5], 6) for row in stored] == [1, 0.5, 0.7, 0.6, 0.5]
    reasons = dict(rows(db_url, "SELECT custom_id, route_reason FROM prompts"))
    assert reasons["window-8h"].endswith("background-8h (8h) + margin (1h): the cheapest lane that does (40% off)")
    counted = sim.stats()["by_status"]
    assert counted["background_window_2h"] == counted["background_window_8h"] == 1
    assert counted["background_created"] == 2
    summary = json.loads(done.stdout)
    assert summary["routes"] == {lane: {"succeeded": 1} for lane in
                                 ("realtime", "flex", "background-2h", "background-8h", "batch")}
    assert summary["cost"]["savings"] > 0


# --- cost per lane and endpoint (issue 27's must-show: a mixed file with --simulate --wait) -----------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lanes.jsonl"


@pytest.mark.prefect
async def test_the_mixed_example_answers_each_prompt_once_by_its_lane_and_reports_cost_per_lane_and_endpoint(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    done = cli("run", str(EXAMPLE), "--simulate", "--wait", "--json", env=cli_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answered = rows(db_url, "SELECT p.custom_id, p.endpoint, r.route, COUNT(*) FROM prompts p "
                            "JOIN results r ON r.prompt_id = p.id GROUP BY p.id ORDER BY p.position")
    assert answered == [
        ("chat-urgent", "chat", "realtime", 1), ("chat-3h", "chat", "flex", 1), ("chat-bulk", "chat", "batch", 1),
        ("responses-urgent", "responses", "realtime", 1), ("responses-3h", "responses", "background-2h", 1),
        ("responses-overnight", "responses", "background-8h", 1), ("responses-bulk", "responses", "batch", 1),
        ("embeddings-urgent", "embeddings", "realtime", 1), ("embeddings-3h", "embeddings", "realtime", 1),
        ("embeddings-bulk", "embeddings", "batch", 1)]
    summary = json.loads(done.stdout)
    endpoints = summary["cost"]["endpoints"]
    assert {endpoint: list(by_lane) for endpoint, by_lane in endpoints.items()} == {
        "chat": ["realtime", "flex", "batch"],
        "embeddings": ["realtime", "batch"],
        "responses": ["realtime", "background-2h", "background-8h", "batch"]}
    assert all(paid["requests"] == (2 if (endpoint, lane) == ("embeddings", "realtime") else 1)
               for endpoint, by_lane in endpoints.items() for lane, paid in by_lane.items())
    # Chat's and responses' lanes cost more than a millionth of a dollar each (--json's precision); a few embedded
    # tokens less, but every answer's stored cost is known and above 0.
    assert all(paid["cost"] > 0 for endpoint in ("chat", "responses") for paid in endpoints[endpoint].values())
    assert rows(db_url, "SELECT COUNT(*) FROM results WHERE cost_pico_usd IS NULL OR cost_pico_usd <= 0") == [(0,)]
    # Every lane's cost adds up to the run's (each rounded to the dollar's millionth); the stored discounts are the
    # catalog's.
    assert sum(paid["cost"] for by_lane in endpoints.values() for paid in by_lane.values()) == pytest.approx(
        summary["cost"]["total"], abs=1e-5)
    assert dict(rows(db_url, "SELECT DISTINCT r.route, r.discount FROM results r")) == {
        "realtime": "0", "flex": "0.5", "background-2h": "0.3", "background-8h": "0.4", "batch": "0.5"}

    status = cli("status", summary["job_id"][:8], "--json", env=cli_env, cwd=tmp_path)
    assert status.returncode == 0, status.stderr[-2000:]
    assert json.loads(status.stdout)["cost_per_endpoint"]["responses"]["background-8h"] == pytest.approx(
        endpoints["responses"]["background-8h"]["cost"], abs=1e-12)

    async with get_client() as client:
        [found] = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["dispatch-lanes-jsonl-report"])),
            sort=ArtifactSort.CREATED_DESC, limit=1)
    markdown = str(found.data)
    assert "## Cost per endpoint and lane" in markdown and "| responses | background-2h | 1 |" in markdown
