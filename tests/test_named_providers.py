"""Named providers: a providers file declares hosts beside OpenAI, Anthropic and Gemini; one input mixes them, each
prompt goes to its model's provider (real-time or through that provider's batches), and costs are kept per
provider. The mixed example through `llm-dispatch run --simulate --wait` in its own process, and the dispatch flow
against one simulator serving a named provider at its own path, both over real sockets."""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import SecretStr

from conftest import cli, rows, successes_per_prompt
from llm_dispatch.core import (
    ConfigError,
    InputError,
    PriceTable,
    ProviderTable,
    Settings,
    check_prompts,
    load_providers,
    to_json,
)

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "mixed-providers.jsonl"
PROVIDERS = ROOT / "examples" / "providers.toml"

TWO_HOSTS = """
[providers.groq]
wire = "openai"
base_url = "https://api.groq.example/openai/v1"
key_env = "GROQ_TEST_KEY"
models = ["llama-3.3-70b", "qwen-*"]
[providers.groq.prices."llama-3.3-70b"]
input = 0.5
output = 1

[providers.together]
wire = "openai"
base_url = "https://api.together.example/v1"
key_env = "TOGETHER_TEST_KEY"
batch_api = false
models = ["llama-3.3-70b"]

[providers.vertexish]
wire = "anthropic"
base_url = "https://claude.example"
models = ["house-claude"]
"""


def example_prompts() -> list[dict]:
    return [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_", "GROQ_"))}
    return {**env, **extra}


@pytest.fixture
def hosts(tmp_path: Path) -> ProviderTable:
    path = tmp_path / "providers.toml"
    path.write_text(TWO_HOSTS)
    return ProviderTable.from_settings(Settings(providers_file=str(path)))


def test_a_model_goes_to_the_provider_its_prefix_or_the_files_lists_name(hosts: ProviderTable) -> None:
    route = hosts.resolve("groq/llama-3.3-70b")
    assert (route.provider, route.wire, route.model, route.upstream) == (
        "groq", "openai", "groq/llama-3.3-70b", "llama-3.3-70b")
    # A bare name one provider lists goes there, recorded under its qualified name.
    assert hosts.resolve("qwen-32b")[:3] == ("groq", "openai", "groq/qwen-32b")
    assert hosts.resolve("house-claude")[:3] == ("vertexish", "anthropic", "vertexish/house-claude")
    # The built-in rule for the rest; a name whose first part is no declared provider is a model name (HF-style).
    assert hosts.resolve("claude-haiku-5-5")[:3] == ("anthropic", "anthropic", "claude-haiku-5-5")
    assert hosts.resolve("openai/gpt-oss-120b")[:3] == ("openai", "openai", "openai/gpt-oss-120b")
    assert hosts.resolve("gpt-6-luna").provider == "openai"


def test_a_model_two_providers_list_is_refused_until_named_with_its_provider(hosts: ProviderTable) -> None:
    with pytest.raises(ValueError, match=r"llama-3.3-70b is served by groq and together .*groq/llama-3.3-70b"):
        hosts.resolve("llama-3.3-70b")
    assert hosts.resolve("together/llama-3.3-70b").provider == "together"
    assert hosts.resolve("groq/llama-3.3-70b").provider == "groq"


def test_model_providers_may_name_a_declared_provider(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"providers": {"vllm": {"wire": "openai", "base_url": "http://gpu-box:8000/v1"}}}))
    table = ProviderTable.from_settings(Settings(providers_file=str(path), model_providers={"my-*": "vllm"}))
    assert table.resolve("my-model")[:3] == ("vllm", "openai", "vllm/my-model")
    assert table.declared_model("my-model") and not table.declared_model("gpt-6-luna")
    with pytest.raises(ConfigError, match="maps 'x' to 'mistral', which is no provider"):
        ProviderTable.from_settings(Settings(providers_file=str(path), model_providers={"x": "mistral"}))


@pytest.mark.parametrize(("text", "problem"), [
    ('[providers.groq]\nwire = "grpc"\nbase_url = "https://x"\n', "field 'providers.groq.wire' must be one of"),
    ('[providers.groq]\nwire = "openai"\n', "field 'providers.groq.base_url' is missing"),
    ('[providers.openai]\nwire = "openai"\nbase_url = "https://x"\n', "is a built-in provider"),
    ('[providers.groq]\nwire = "openai"\nbase_url = "https://x"\napi_key = "sk-secret"\n',
     "field 'providers.groq.api_key' is unknown"),
    ('[providers.groq]\nwire = "openai"\nbase_url = "https://x"\nbatch_api = "maybe"\n', "true, false or \"learn\""),
    ('[providers.g]\nwire = "openai"\nbase_url = "https://u:pw@x"\n[providers.g]\n', "invalid TOML"),
    ('[groq]\nwire = "openai"\n', "expected one table 'providers'"),
])
def test_a_bad_providers_file_is_one_line_naming_the_file_and_the_field(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_providers(path)
    message = str(raised.value)
    assert message.startswith(f"providers file {path}: ") and problem in message and "\n" not in message
    assert "sk-secret" not in message and "pw@" not in message


def test_declared_models_are_priced_by_their_provider_alone_and_never_at_zero(hosts: ProviderTable) -> None:
    table = PriceTable.load(providers=hosts)
    groq = table.price_for("groq/llama-3.3-70b")
    assert groq is not None and (groq.input, groq.output) == (Decimal("0.5"), Decimal("1"))
    # Another host serving a catalog model's name is not priced as the catalog's model: unknown, not $0.
    assert PriceTable.load().price_for("gpt-6-luna") is not None
    assert table.price_for("together/gpt-6-luna") is None and table.price_for("groq/qwen-32b") is None
    assert table.price(model="groq/qwen-32b", route="realtime", prompt_tokens=10, completion_tokens=10) is None


def test_the_input_check_records_each_prompt_under_its_provider(tmp_path: Path, hosts: ProviderTable) -> None:
    prompts = tmp_path / "in.jsonl"
    lines = [{"id": "a", "model": "qwen-32b", "prompt": "hi"},
             {"id": "b", "model": "together/llama-3.3-70b", "prompt": "hi"},
             {"id": "c", "model": "house-claude", "prompt": "hi", "params": {"max_tokens": 20}},
             {"id": "d", "model": "gpt-6-luna", "prompt": "hi"}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    checked = check_prompts(prompts, default_model="gpt-6-luna", table=PriceTable.load(providers=hosts),
                            model_providers=hosts, keep=10)
    assert checked.providers == {"groq", "together", "vertexish", "openai"}
    assert checked.specs is not None
    assert [(s.model, s.provider) for s in checked.specs] == [
        ("groq/qwen-32b", "groq"), ("together/llama-3.3-70b", "together"), ("vertexish/house-claude", "vertexish"),
        ("gpt-6-luna", "openai")]
    # An Anthropic-wire provider's prompts are checked by Anthropic's rules.
    prompts.write_text(json.dumps({"id": "x", "model": "house-claude", "prompt": "hi", "params": {"seed": 1}}) + "\n"
                       + json.dumps({"id": "y", "model": "llama-3.3-70b", "prompt": "hi"}) + "\n")
    with pytest.raises(InputError) as raised:
        check_prompts(prompts, default_model="gpt-6-luna", model_providers=hosts)
    assert [problem.line for problem in raised.value.problems] == [1, 2]
    assert "'seed' has no Anthropic equivalent" in str(raised.value.problems[0])
    assert "served by groq and together" in str(raised.value.problems[1])


def test_a_declared_providers_missing_key_is_one_error_line_before_anything_is_written(tmp_path: Path) -> None:
    providers = tmp_path / "providers.toml"
    providers.write_text(TWO_HOSTS)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"id": "a", "model": "groq/llama-3.3-70b", "prompt": "hi", "urgency": "urgent"}) + "\n")
    done = cli("run", str(prompts), "--providers-file", str(providers),
               env=clean_env(OPENAI_API_KEY="sk-test", TOGETHER_TEST_KEY="tk-secret-value"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "GROQ_TEST_KEY" in line and "groq" in line and "https://api.groq.example/openai/v1" in line
    assert "tk-secret-value" not in done.stderr + done.stdout
    assert not (tmp_path / "llm_dispatch.db").exists()


@pytest.mark.prefect
def test_the_mixed_example_answers_each_prompt_once_through_its_provider_and_lane(
    prefect_api: str, tmp_path: Path
) -> None:
    done = cli("run", str(EXAMPLE), "--providers-file", str(PROVIDERS), "--simulate", "--wait", "--sim-latency",
               "0.02", "--json", env=clean_env(PREFECT_API_URL=prefect_api), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    prompts = {p["id"]: p for p in example_prompts()}
    assert summary["counts"] == {"succeeded": len(prompts)} and summary["unfinished"] == 0
    db = f"sqlite+aiosqlite:///{tmp_path / 'llm_dispatch.db'}"
    assert set(successes_per_prompt(db).values()) == {1}  # every prompt answered exactly once
    expected = {"gpt": "openai", "claude": "anthropic", "gemini": "gemini", "groq/": "groq"}
    answered = rows(db, """SELECT p.custom_id, p.provider, r.route, r.response_id, r.response_model
                           FROM prompts p JOIN results r ON r.prompt_id = p.id""")
    for custom_id, provider, route, response_id, response_model in answered:
        model = prompts[custom_id]["model"]
        assert provider == next(name for start, name in expected.items() if model.startswith(start)), custom_id
        # Each answer came from its provider's own API: Messages, generateContent, or chat completions (the
        # declared host's under the name it knows, without its prefix).
        prefix = {"anthropic": "msg_", "gemini": None}.get(provider, "chatcmpl-")
        if prefix is not None:
            assert response_id.startswith(prefix), custom_id
        assert response_model == model.removeprefix("groq/"), custom_id
        # Urgent prompts real-time; bulk ones through their provider's batches (Gemini's: either lane, until its
        # Batch Mode lands).
        if prompts[custom_id]["urgency"] == "urgent":
            assert route == "realtime", custom_id
        elif provider != "gemini":
            assert route == "batch", custom_id
    batches = dict(rows(db, "SELECT provider, COUNT(*) FROM batches GROUP BY provider"))
    assert {"openai", "anthropic", "groq"} <= set(batches)
    members = dict(rows(db, """SELECT b.provider, COUNT(*) FROM batches b JOIN batch_members m ON m.batch_id = b.id
                               GROUP BY b.provider"""))
    for provider in ("openai", "anthropic", "groq"):
        assert members[provider] == sum(p["urgency"] == "bulk" and expected_provider(p) == provider
                                        for p in prompts.values())
    # Cost per provider, each priced (the declared host by its file's prices), adding up to the total.
    actual = summary["cost"]["providers"]
    assert set(actual) == {"openai", "anthropic", "gemini", "groq"}
    for provider, by_route in actual.items():
        assert sum(r["requests"] for r in by_route.values()) == sum(expected_provider(p) == provider
                                                                    for p in prompts.values()), provider
        assert all(r["cost"] > 0 for r in by_route.values() if r["requests"]), provider
    assert round(sum(r["cost"] for by_route in actual.values() for r in by_route.values()), 6) == pytest.approx(
        summary["cost"]["total"], abs=1e-5)
    # status and cost read the stored provider back, with no providers file given.
    shown = cli("cost", summary["job_id"] if "job_id" in summary else summary["report"]["job_id"], "--json",
                env=clean_env(PREFECT_API_URL=prefect_api), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "groq" in json.loads(shown.stdout)["providers"]


def expected_provider(prompt: dict) -> str:
    model = prompt["model"]
    return "groq" if model.startswith("groq/") else "anthropic" if model.startswith("claude-") else (
        "gemini" if model.startswith("gemini-") else "openai")


@pytest.mark.prefect
async def test_one_simulator_serves_a_named_provider_beside_the_built_in_ones(
    prefect_api: str, db_url: str, tmp_path: Path
) -> None:
    """Each provider's requests reach its own path on the one simulator: the declared host's real-time calls and
    batches are counted at /p/NAME alone."""
    from llm_dispatch.flows.dispatch import dispatch
    from llm_dispatch.simulator import Simulator, SimulatorConfig

    providers = tmp_path / "providers.json"
    providers.write_text(json.dumps({"providers": {"groq": {
        "wire": "openai", "base_url": "https://api.groq.example/openai/v1", "key_env": "GROQ_TEST_KEY",
        "batch_api": True, "models": ["llama-3.3-70b-versatile"]}}}))
    prompts = [{"id": f"{kind}-{i}", "model": model, "prompt": f"question {i}", "urgency": urgency,
                "params": {"max_tokens": 20}}
               for kind, model in (("groq", "llama-3.3-70b-versatile"), ("openai", "gpt-6-luna"),
                                   ("claude", "claude-haiku-5-5"))
               for i, urgency in enumerate(("urgent", "urgent", "bulk"))]
    async with Simulator(SimulatorConfig(batch_processing_seconds=0.3), providers=["groq"]) as sim:
        summary = to_json(await dispatch(
            prompts=prompts, base_url=sim.base_url, anthropic_base_url=sim.anthropic_base_url,
            providers_file=str(providers), provider_base_urls={"groq": sim.provider_base_url("groq")},
            database_url=SecretStr(db_url), wait=True, batch_poll_interval=0.1, allow_unknown_model=True))
        groq, root = sim.stats(provider="groq"), sim.stats()
    assert summary["counts"] == {"succeeded": len(prompts)}
    assert (groq["completions"], groq["batches"], groq["batch_lines"]) == (2, 1, 1)
    assert groq["messages"] == 0 and groq["message_batches"] == 0
    assert (root["completions"], root["batches"], root["batch_lines"]) == (2, 1, 1)
    assert (root["messages"], root["message_batches"], root["message_batch_lines"]) == (2, 1, 1)
    stored = dict(rows(db_url, "SELECT custom_id, model FROM prompts WHERE provider = 'groq'"))
    assert stored == {f"groq-{i}": "groq/llama-3.3-70b-versatile" for i in range(3)}


@pytest.mark.prefect
async def test_a_declared_host_without_a_batch_api_sends_its_bulk_prompts_real_time_and_only_its_own(
    prefect_api: str, db_url: str, tmp_path: Path
) -> None:
    """``batch_api = "learn"``: the host's 404 on its files is remembered for its URL alone (OpenAI's batches go on);
    ``batch_api = false``: never tried, its prompts real-time from the start."""
    import httpx

    from llm_dispatch.flows.dispatch import dispatch
    from llm_dispatch.simulator import Simulator, SimulatorConfig

    providers = tmp_path / "providers.toml"
    providers.write_text('[providers.vllm]\nwire = "openai"\nbase_url = "http://gpu.example:8000/v1"\n'
                         'models = ["local-*"]\n\n[providers.ollama]\nwire = "openai"\n'
                         'base_url = "http://ollama.example:11434/v1"\nbatch_api = false\nmodels = ["tiny-*"]\n')
    prompts = [{"id": f"{model}-{i}", "model": model, "prompt": f"question {i}", "urgency": "bulk",
                "params": {"max_tokens": 20}}
               for model in ("local-model", "tiny-model", "gpt-6-luna") for i in range(2)]
    async with Simulator(SimulatorConfig(batch_processing_seconds=0.3), providers=["vllm", "ollama"]) as sim:
        async with httpx.AsyncClient(timeout=5) as admin:  # as vLLM and Ollama: no /v1/files, no /v1/batches
            for name in ("vllm", "ollama"):
                (await admin.post(f"{sim.anthropic_base_url}/p/{name}/_sim/config", json={"batch_api": False})
                 ).raise_for_status()
        summary = to_json(await dispatch(
            prompts=prompts, base_url=sim.base_url, providers_file=str(providers),
            provider_base_urls={"vllm": sim.provider_base_url("vllm"), "ollama": sim.provider_base_url("ollama")},
            database_url=SecretStr(db_url), wait=True, batch_poll_interval=0.1, allow_unknown_model=True))
        vllm, ollama, root = sim.stats(provider="vllm"), sim.stats(provider="ollama"), sim.stats()
        vllm_url = sim.provider_base_url("vllm")
    assert summary["counts"] == {"succeeded": len(prompts)}
    assert set(successes_per_prompt(db_url).values()) == {1}
    routes = dict(rows(db_url, """SELECT p.custom_id, r.route FROM prompts p JOIN results r ON r.prompt_id = p.id"""))
    assert {route for custom_id, route in routes.items() if custom_id.startswith("gpt")} == {"batch"}
    assert {route for custom_id, route in routes.items() if not custom_id.startswith("gpt")} == {"realtime"}
    assert (vllm["completions"], ollama["completions"], root["batches"], root["batch_lines"]) == (2, 2, 1, 2)
    # Learnt for the host that answered 404 alone; the one declared without a Batch API was never tried.
    learnt = [url for (url,) in rows(db_url, "SELECT base_url FROM endpoint_capabilities WHERE batch_api = 0")]
    assert learnt == [vllm_url]


def test_collect_takes_the_providers_file_and_names_a_missing_one(tmp_path: Path) -> None:
    done = cli("collect", "--providers-file", str(tmp_path / "nope.toml"), env=clean_env(), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"error: --providers-file: no such file: {tmp_path / 'nope.toml'}"
