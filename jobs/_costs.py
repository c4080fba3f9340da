"""The cost ledger of a job: the estimate before anything is sent, the actual cost from stored usage,
and what the Batch API saved. Plain async code over storage and the price table (no Prefect)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from llm_dispatch import ChatRequest, CostTotals, PriceTable, estimate_request_cost

__all__ = ["JobCost", "actual_cost", "estimate_cost", "money"]

Sessions = async_sessionmaker[AsyncSession]
# Answers of a model this database must hold before the reply length learnt from them replaces the setting.
CALIBRATION_MIN = 20


@dataclass(slots=True)
class JobCost:
    """A job's cost per route (``totals``), as estimated or as reported by the provider.

    ``max_total`` (estimates) prices every reply at the longest its request allows: its cap, else its
    model's maximum output. It is None, unbounded, when some priced request has neither
    (``unbounded_models`` counts them per model); like ``total`` it leaves unpriced models out.
    ``reply_tokens`` is the typical (uncapped) reply length the estimate assumed per model.
    """

    totals: CostTotals
    max_total: Decimal | None = Decimal(0)
    reply_tokens: dict[str, int] = field(default_factory=dict)
    # Model name -> priced requests with no max_tokens to a model of unknown maximum output.
    unbounded_models: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> Decimal:
        return self.totals.cost

    @property
    def savings(self) -> Decimal:
        return self.totals.savings

    @property
    def complete(self) -> bool:
        """False when some model had no price, so ``total`` leaves part of the cost out."""
        return not self.totals.unpriced_models

    def as_dict(self) -> dict[str, Any]:
        routes = {}
        for route in storage.SEND_ROUTES:
            r = getattr(self.totals, route)
            routes[route] = {"requests": r.prompts, "prompt_tokens": r.prompt_tokens,
                             "completion_tokens": r.completion_tokens, "cached_tokens": r.cached_tokens,
                             "cost": money(r.cost), "unpriced": r.unpriced}
        return {"total": money(self.total),
                "max_total": None if self.max_total is None else money(self.max_total),
                "unbounded_models": dict(self.unbounded_models), "savings": money(self.savings),
                "complete": self.complete, "unpriced_models": dict(self.totals.unpriced_models),
                "prices_as_of": self.totals.table.prices_as_of, "reply_tokens": dict(self.reply_tokens),
                "routes": routes}


def money(value: Decimal) -> float:
    """Dollars for JSON and tables, to a millionth (a small job's whole cost is a fraction of a cent)."""
    return float(value.quantize(Decimal("0.000001")))


async def estimate_cost(
    *,
    sessions: Sessions,
    job_id: str,
    table: PriceTable,
    typical_completion_tokens: int,
    retry_failed: Literal["retryable", "all", "none"] = "retryable",
    dedupe: bool = True,
) -> JobCost:
    """What sending the job's open prompts will cost, per planned route, before anything is sent.

    Input tokens are estimated offline (see ``llm_dispatch._tokens``); each reply is expected at the
    model's typical length as cut by the request's cap (``llm_dispatch._pricing.expected_reply_tokens``;
    ``max_total`` prices every reply at the longest allowed, see ``JobCost``). The typical length of a model is learnt from its last
    answers in this database once there are ``CALIBRATION_MIN`` of them (``storage.ReplyLengths.typical``:
    answers cut at their cap count as longer), else ``typical_completion_tokens``. Identical requests
    count once when ``dedupe`` is on, as they are sent once.
    """
    estimate = JobCost(totals=CostTotals(table=table))
    bound = Decimal(0)
    rows_by_route = {}
    for route in storage.SEND_ROUTES:
        ids = await storage.open_prompt_ids(sessions, job_id=job_id, retry_failed=retry_failed, planned_route=route)
        rows_by_route[route] = await storage.load_work(sessions, prompt_ids=ids)
    models = sorted({row.model for rows in rows_by_route.values() for row in rows})
    seen_lengths = await storage.reply_lengths(sessions, models=models)
    estimate.reply_tokens = {
        model: round(seen_lengths[model].typical)
        if model in seen_lengths and seen_lengths[model].replies >= CALIBRATION_MIN
        else typical_completion_tokens
        for model in models
    }
    for route in storage.SEND_ROUTES:
        seen: set[str] = set()
        for row in rows_by_route[route]:
            if dedupe:
                if row.dedupe_key in seen:
                    continue
                seen.add(row.dedupe_key)
            request = ChatRequest(model=row.model, messages=row.messages, params=row.params)
            guess = estimate_request_cost(request=request, route=route, table=table,  # type: ignore[arg-type]
                                          typical_completion_tokens=estimate.reply_tokens[row.model])
            estimate.totals.add(model=row.model, route=route, prompt_tokens=guess.prompt_tokens,  # type: ignore[arg-type]
                                completion_tokens=guess.completion_tokens)
            if guess.cost is None:
                continue  # unpriced: counted in totals.unpriced_models, out of both figures
            if guess.max_cost is None:
                estimate.unbounded_models[row.model] = estimate.unbounded_models.get(row.model, 0) + 1
            else:
                bound += guess.max_cost
    estimate.max_total = None if estimate.unbounded_models else bound
    return estimate


async def actual_cost(*, sessions: Sessions, job_id: str, table: PriceTable) -> JobCost:
    """The job's cost from the usage providers reported, cached input priced as cached.

    Only answered requests count (failed calls are not billed; ``reused`` answers were paid once).
    """
    ledger = JobCost(totals=CostTotals(table=table))
    for usage in await storage.usage_by_route(sessions, job_id=job_id):
        ledger.totals.add(model=usage.model, route=usage.route, prompt_tokens=usage.prompt_tokens,  # type: ignore[arg-type]
                          completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
                          requests=usage.prompts)
    # What was paid is its own bound.
    ledger.max_total = ledger.total
    return ledger
