"""One way to run the ``dispatch`` flow from the top layer, shared by ``llm-dispatch run`` and ``run_prompts``: the
bundled simulator in this process, and the flow run under the command's Prefect settings, its summary read whether
the run ended Completed, Failed (failed prompts) or BudgetReached."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from llm_dispatch.core import ConfigError, RetryFailed, Settings, flow_parameters

from ._prefect import _prefect_settings

if TYPE_CHECKING:
    from llm_dispatch.jobs import DispatchSummary

# With the simulator its batches take seconds, not hours; poll them as often.
SIM_BATCH_SECONDS = 3.0
SIM_POLL_SECONDS = 0.5


def check_simulated_wait(*, simulate: bool, wait: bool) -> None:
    """A simulated run waits for its batches: the simulator lives in this process and its batches end with it,
    which would leave batches open in the database that no provider knows."""
    if simulate and not wait:
        raise ConfigError(
            "--no-wait cannot go with --simulate: the simulator stops with this command and its batches with it; drop "
            f"--no-wait (its batches take {SIM_BATCH_SECONDS:.0f} s), or run `llm-dispatch simulate` apart, point "
            "LLM_DISPATCH_BASE_URL at it and leave out --simulate")


@contextlib.contextmanager
def simulated(settings: Settings, *, latency: float) -> Iterator[Settings]:
    """``settings`` sending to the bundled simulator, run in a thread of this process for the block: one server
    answers every provider (OpenAI's API under /v1, Anthropic's and Gemini's at the host, each declared provider's
    under /p/NAME), batches in ``SIM_BATCH_SECONDS``."""
    from llm_dispatch.core import ProviderTable
    from llm_dispatch.simulator import Simulator, SimulatorConfig, provider_base_url

    config = SimulatorConfig(latency=latency, batch_processing_seconds=SIM_BATCH_SECONDS)
    # Each provider the providers file declares is served beside the built-in three, at its own path, speaking its
    # own wire, with state of its own.
    declared = ProviderTable.from_settings(settings).declared
    with Simulator.in_thread(config, providers=list(declared)) as base_url:
        urls = {name: provider_base_url(base_url, name, wire=provider.wire) for name, provider in declared.items()}
        yield settings.model_copy(update={"base_url": base_url, "anthropic_base_url": base_url.removesuffix("/v1"),
                                          "gemini_base_url": base_url.removesuffix("/v1"),
                                          "provider_base_urls": urls, "batch_poll_interval": SIM_POLL_SECONDS})


async def dispatch_summary(
    *,
    source: str | list[dict[str, Any]] | None,
    job_id: str | None,
    settings: Settings,
    wait: bool,
    max_cost: float | None,
    retry_failed: RetryFailed = "retryable",
    retry_refused: bool = False,
    new_job: bool = False,
    job_name: str | None = None,
    fail_above: float = 0.0,
) -> DispatchSummary:
    """Run the ``dispatch`` flow over ``source`` (or resume ``job_id``) with every setting as its parameter; its
    summary, also when the run ended Failed for failed prompts or stopped on its budget. An error of the run
    (bad input, ``max_cost`` refused) is raised."""
    from llm_dispatch.flows.dispatch import dispatch
    from llm_dispatch.tasks import result_of

    with _prefect_settings():
        summary: DispatchSummary = await result_of(await dispatch(
            prompts=source, job_id=job_id, wait=wait, max_cost=max_cost, retry_failed=retry_failed,
            retry_refused=retry_refused, new_job=new_job, job_name=job_name, fail_above=fail_above,
            **flow_parameters(settings, door="dispatch"), return_state=True,
        ))
    return summary
