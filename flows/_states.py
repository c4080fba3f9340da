"""How a job's run ends in the Prefect UI: ``Failed`` when prompts failed (above ``fail_above``, a share), so that
automations and alerts on failed runs fire; ``BudgetReached`` when it stopped on its budget; ``Completed`` otherwise,
its message counting failures it tolerated. Every state is made by ``tasks.run_state``; the run's result travels in
it either way (a caller reads it with ``tasks.result_of``)."""

from __future__ import annotations

from typing import Any

from prefect.client.schemas.objects import State as StateObject

from llm_dispatch.core import counted, to_json
from llm_dispatch.jobs import BudgetStanding
from llm_dispatch.tasks import run_state

__all__ = ["BUDGET_REACHED", "FAILED_PROMPTS", "MAX_COST_REFUSED", "failed_prompts", "final_state"]

# The state's name: a Completed run that left prompts pending because the next request's worst case did not fit.
BUDGET_REACHED = "BudgetReached"
# A Failed run refused by --max-cost before anything was sent (the estimate was above it).
MAX_COST_REFUSED = "MaxCostRefused"
# How the message of a run that failed for its prompts (and for nothing else) begins.
FAILED_PROMPTS = "prompts failed: "


def final_state(result: object, *, budget: BudgetStanding | None, fail_above: float = 0.0) -> Any:
    """What a job's flow returns: a ``Failed`` state holding ``result`` (a summary with the job's ``counts`` and
    ``failed_by_class``) when more than ``fail_above`` of the job's prompts failed (by default: any),
    ``BudgetReached`` when the run stopped on its budget, a ``Completed`` one naming the failures within
    ``fail_above``, else ``result`` itself."""
    shown = to_json(result)
    counts = shown.get("counts") or {}
    failed, total = counts.get("failed", 0), sum(counts.values())
    share = failed / total if total else 0.0
    said = f"{failed:,} of {counted(total, 'prompt')} failed ({share:.1%}"
    classes = ", ".join(f"{name} {n}" for name, n in sorted((shown.get("failed_by_class") or {}).items()))
    stopped = budget is not None and budget.stopped
    if failed and share > fail_above:
        limit = f", above --fail-above {fail_above:.1%}" if fail_above else ""
        also = f"; {budget.describe()}" if stopped and budget is not None else ""
        return run_state(result, failure=f"{FAILED_PROMPTS}{said}{limit}): {classes}{also}")
    if stopped and budget is not None:
        return run_state(result, message=budget.describe(), name=BUDGET_REACHED)
    if failed:
        return run_state(result, message=f"{said}, within --fail-above {fail_above:.1%}): {classes}")
    return result


def failed_prompts(state: StateObject | None) -> bool:
    """Whether a run ended ``Failed`` for its failed prompts only: its work is done, and stored."""
    return state is not None and state.is_failed() and (state.message or "").startswith(FAILED_PROMPTS)
