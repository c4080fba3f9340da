"""The cost ledger of a job: the estimate before anything is sent, the actual cost as stored with each
answer, what the Batch API saved, and what the job would cost under another price table (``reprice``).
Plain async code over storage and the price table (no Prefect)."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, ClassVar

from llm_dispatch import storage
from llm_dispatch.core import ChatRequest, CostTotals, EstimateSums, PriceTable, RouteTotals, from_pico, provider_lookup
from llm_dispatch.core import REQUEST_ROUTES, ROUTES, RetryFailed, Route, json_field, money


if TYPE_CHECKING:  # handed in by the estimate's callers: the reports (actual_cost) load no cache planning
    from ._cache_plan import CacheEstimate, CachePlanning, JobPrefixes

__all__ = ["JobCost", "PriceBasis", "RepricedRow", "Repricing", "actual_cost", "counted_prompts", "estimate_cost", "money",
           "reprice"]
# Answers of a model this database must hold before the reply length learnt from them replaces the setting.
CALIBRATION_MIN = 20
# Open prompts read per query while estimating (a keyset page; memory stays at one page).
ESTIMATE_PAGE = 2000


@dataclass(frozen=True, slots=True)
class PriceBasis:
    """Which prices some of a job's stored costs were worked out with, and when."""

    prices_as_of: str | None
    # The user's price file merged over the bundled table; None: the bundled one.
    prices_file: str | None
    # "answer": priced as the answer was stored; "backfill": priced by migration 0004 from the tokens,
    # with the bundled prices of ``prices_as_of``; None: stored without a price table (cost unknown).
    cost_basis: str | None
    requests: int


@dataclass(slots=True)
class JobCost:
    """A job's cost per route (``totals``), as estimated, or as stored with its answers (``priced_with``
    says with which prices).

    ``max_total`` (estimates) prices every reply at the longest its request allows: its cap, else its
    model's maximum output. It is None, unbounded, when some priced request has neither
    (``unbounded_models`` counts them per model); like ``total`` it leaves unpriced models out.
    ``reply_tokens`` is the typical (uncapped) reply length the estimate assumed per model.
    """

    json_properties: ClassVar = ("total", "planned_total", "savings", "complete", "unpriced_models", "prices_as_of",
                                 "backfilled", "routes", "providers", "endpoints")

    totals: CostTotals = json_field(skip=True)
    max_total: Decimal | None = Decimal(0)
    reply_tokens: dict[str, int] = field(default_factory=dict)
    # Model name -> priced requests with no max_tokens to a model of unknown maximum output.
    unbounded_models: dict[str, int] = field(default_factory=dict)
    # Stored costs: the price tables they came from, oldest date first.
    priced_with: list[PriceBasis] = field(default_factory=list)
    # Estimates: the prefixes the prompts share and the cache plan for them, priced (``total`` prices them uncached).
    cache: CacheEstimate | None = json_field(omit_none=True, default=None)

    @property
    def total(self) -> Decimal:
        return self.totals.cost

    @property
    def planned_total(self) -> Decimal:
        """``total`` with each shared prefix priced as the cache plan sends it (writes at their premium, hits at the
        cached price) instead of uncached; ``total`` where there is no plan (off, or no prefix shared)."""
        return self.total if self.cache is None else self.total - self.cache.saved

    @property
    def savings(self) -> Decimal:
        return self.totals.savings

    @property
    def complete(self) -> bool:
        """False when some model had no price, so ``total`` leaves part of the cost out."""
        return not self.totals.unpriced_models

    @property
    def prices_as_of(self) -> str:
        """The date of the prices: the table's, or those the stored costs were worked out with."""
        if self.totals.table is not None:
            return self.totals.table.prices_as_of
        return ", ".join(sorted({basis.prices_as_of for basis in self.priced_with if basis.prices_as_of})) or "-"

    @property
    def backfilled(self) -> int:
        """Requests whose stored cost was back-filled at migration, not recorded when answered."""
        return sum(basis.requests for basis in self.priced_with if basis.cost_basis == "backfill")

    @property
    def unpriced_models(self) -> dict[str, int]:
        return self.totals.unpriced_models

    @property
    def routes(self) -> dict[str, RouteTotals]:
        """Totals per lane: real-time and the Batch API always, each other lane where some prompt took it."""
        lanes = self.totals.lanes
        return {route: lanes.get(route) or RouteTotals() for route in ROUTES
                if route in lanes or route in ("realtime", "batch")}

    @property
    def endpoints(self) -> dict[str, dict[str, RouteTotals]]:
        """Totals per endpoint (chat, responses, embeddings) and lane, each lane in ``ROUTES`` order."""
        return {endpoint: {route: by_route[route] for route in ROUTES if route in by_route}
                for endpoint, by_route in sorted(self.totals.endpoints.items())}

    @property
    def providers(self) -> dict[str, dict[str, RouteTotals]]:
        return {provider: dict(sorted(by_route.items())) for provider, by_route in sorted(self.totals.providers.items())}


async def estimate_cost(
    *,
    sessions: storage.Sessions,
    job_id: str,
    table: PriceTable,
    typical_completion_tokens: int,
    retry_failed: RetryFailed = "retryable",
    dedupe: bool = True,
    provider_of: Callable[[str], str] | None = None,
    recorded: EstimateSums | None = None,
    cache: CachePlanning | None = None,
) -> JobCost:
    """What sending the job's open prompts will cost, per planned route (lane), before anything is sent.

    Input tokens are estimated offline (see ``llm_dispatch._tokens``); each reply is expected at the
    model's typical length as cut by the request's cap (``llm_dispatch._costs.expected_reply_tokens``;
    ``max_total`` prices every reply at the longest allowed, see ``JobCost``). The typical length of a model is learnt from its last
    answers in this database once there are ``CALIBRATION_MIN`` of them (``storage.ReplyLengths.typical``:
    answers cut at their cap count as longer), else ``typical_completion_tokens``. Identical requests
    count once when ``dedupe`` is on, as they are sent once. ``provider_of`` says which provider each
    model goes to, for the totals per provider (default: the built-in rule, ``claude-*`` -> Anthropic).

    ``recorded``: the sums a new job's recording made of its prompts as it stored them (``counted_prompts``), all
    of them open; then they are not read back.

    ``cache``: the estimate also prices the cache plan (``JobCost.cache``, ``planned_total``): the groups the recording
    found with ``recorded`` (``cache.recorded``), else those of the open prompts as they are read back.
    """
    sums = recorded
    prefixes: JobPrefixes | None = None
    if cache is not None and (sums is None or cache.recorded is None):
        sums, prefixes = None, cache.collector()
    if sums is None:
        sums = EstimateSums(table=table)
        for half in ("realtime", "batch"):
            # Pages come ordered by request: an identical request is the one just before it, never held.
            last_key: str | None = None
            async for rows in storage.unfinished_work_pages(sessions, job_id=job_id, page=ESTIMATE_PAGE,
                                                            retry_failed=retry_failed, planned_route=half):
                for row in rows:
                    if dedupe:
                        if row.dedupe_key == last_key:
                            continue
                        last_key = row.dedupe_key
                    request = ChatRequest(model=row.model, messages=row.messages, params=row.params,
                                          endpoint=row.endpoint)
                    sums.add(request, route=_estimated_lane(row.planned_route))
                    if prefixes is not None:
                        prefixes.add(row.id, request, route=row.planned_route)
    reply_tokens = {model: await _typical_reply(sessions, model=model, default=typical_completion_tokens)
                    for model in sorted(sums.models)}
    totals, bound, unbounded = sums.totals(reply_tokens=reply_tokens, provider_of=provider_of)
    planned = None
    if cache is not None:
        planned = cache.recorded if prefixes is None else cache.estimate(prefixes, prices=table)
    return JobCost(totals=totals, max_total=None if unbounded else bound, reply_tokens=reply_tokens,
                   unbounded_models=unbounded, cache=planned)


def _estimated_lane(planned_route: Route | None) -> Route:
    """The lane an open prompt is estimated at: its own where it is sent as a request (real-time, flex, a
    background window), else the Batch API's."""
    if planned_route == "batch":
        return "batch"
    return planned_route if planned_route is not None and planned_route in REQUEST_ROUTES else "realtime"


def counted_prompts(
    prompts: Iterable[storage.NewPrompt], *, sums: EstimateSums, dedupe: bool, repeated: Container[str],
    prefixes: JobPrefixes | None = None,
) -> Iterator[storage.NewPrompt]:
    """``prompts`` unchanged, each added to ``sums`` (and ``prefixes``) on its way to be stored, as ``estimate_cost``
    would read it back from the database: at its lane, and an identical request (``repeated``: the keys the input has
    more than once) once per half when ``dedupe`` is on, as it is sent once."""
    seen: set[tuple[bool, str]] = set()
    for prompt in prompts:
        if dedupe and prompt.dedupe_key in repeated:
            first = (prompt.planned_route == "batch", prompt.dedupe_key)
            if first in seen:
                yield prompt
                continue
            seen.add(first)
        request = ChatRequest(model=prompt.model, messages=prompt.messages, params=prompt.params,
                              endpoint=prompt.endpoint)
        sums.add(request, route=_estimated_lane(prompt.planned_route))
        if prefixes is not None:
            prefixes.add(prompt.position, request, route=prompt.planned_route)
        yield prompt


async def _typical_reply(sessions: storage.Sessions, *, model: str, default: int) -> int:
    """The typical reply length of ``model``: learnt from this database once it holds enough answers."""
    seen = (await storage.reply_lengths(sessions, models=[model])).get(model)
    return round(seen.typical) if seen is not None and seen.replies >= CALIBRATION_MIN else default


async def actual_cost(*, sessions: storage.Sessions, job_id: str, provider_of: Callable[[str], str] | None = None) -> JobCost:
    """The job's cost as stored with each answer when it was stored, whatever the price table says now.

    Only answered requests count (failed calls are not billed; ``reused`` answers were paid once); an
    answer of a model that had no price counts as unknown (``unpriced_models``), never 0. A job's explicit caches
    (their create and storage, ``storage.cache_storage_costs``) count on the real-time lane, as no request.
    """
    ledger = JobCost(totals=CostTotals(table=None, provider_of=provider_of or provider_lookup()))
    bases: dict[tuple[str | None, str | None, str | None], int] = {}
    for usage in await storage.usage_by_route(sessions, job_id=job_id):
        ledger.totals.add_priced(model=usage.model, route=usage.route, endpoint=usage.endpoint,
                                 prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                                 cached_tokens=usage.cached_tokens, requests=usage.prompts,
                                 cost=from_pico(usage.cost_pico_usd), at_realtime=from_pico(usage.list_cost_pico_usd),
                                 unpriced=usage.unpriced, provider=usage.provider)
        key = (usage.prices_as_of, usage.prices_file, usage.cost_basis)
        bases[key] = bases.get(key, 0) + usage.prompts
    # Explicit caches' create and storage (Gemini's): money of the job's, on no request of its own.
    for _, model, provider, cost, unpriced in await storage.cache_storage_costs(sessions, job_id=job_id):
        ledger.totals.add_priced(model=model, route="realtime", prompt_tokens=0, completion_tokens=0, requests=0,
                                 cost=from_pico(cost), at_realtime=from_pico(cost), unpriced=unpriced,
                                 provider=provider)
    ledger.priced_with = [PriceBasis(*key, requests=n)
                          for key, n in sorted(bases.items(), key=lambda item: tuple(v or "" for v in item[0]))]
    # What was paid is its own bound.
    ledger.max_total = ledger.total
    return ledger


@dataclass(frozen=True, slots=True)
class RepricedRow:
    """One route and model of a job: its stored cost beside what the same usage costs under another table."""

    json_properties: ClassVar = ("difference",)

    route: Route
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stored: Decimal
    # Requests whose stored cost is unknown (no price then); ``stored`` leaves them out.
    stored_unpriced: int
    # None when the other table has no price for the model.
    repriced: Decimal | None

    def plus(self, other: RepricedRow) -> RepricedRow:
        """This row and ``other`` (the same route and model) as one."""
        repriced = None if self.repriced is None or other.repriced is None else self.repriced + other.repriced
        return RepricedRow(route=self.route, model=self.model, requests=self.requests + other.requests,
                           prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                           completion_tokens=self.completion_tokens + other.completion_tokens,
                           cached_tokens=self.cached_tokens + other.cached_tokens, stored=self.stored + other.stored,
                           stored_unpriced=self.stored_unpriced + other.stored_unpriced, repriced=repriced)

    @property
    def difference(self) -> Decimal | None:
        """Repriced minus stored; None when either side leaves some of the requests unpriced."""
        if self.repriced is None or self.stored_unpriced:
            return None
        return self.repriced - self.stored


@dataclass(frozen=True, slots=True)
class Repricing:
    """A what-if: the job's stored cost, and what it would cost under ``repriced.totals.table``."""

    json_properties: ClassVar = ("prices_file", "prices_as_of", "difference")

    job_id: str
    rows: list[RepricedRow]
    stored: JobCost
    repriced: JobCost
    # The what-ifs asked for: every real-time answer at this tier; every answer by this route (None: as they were).
    tier: str | None = None
    route: Route | None = None

    @property
    def prices_file(self) -> str | None:
        return self._table.prices_file

    @property
    def prices_as_of(self) -> str:
        return self._table.prices_as_of

    @property
    def difference(self) -> Decimal | None:
        """Repriced minus stored; None when either leaves some requests unpriced."""
        return self.repriced.total - self.stored.total if self.stored.complete and self.repriced.complete else None

    @property
    def _table(self) -> PriceTable:
        table = self.repriced.totals.table
        assert table is not None
        return table


async def reprice(
    *, sessions: storage.Sessions, job_id: str, table: PriceTable, tier: str | None = None,
    route: Route | None = None,
) -> Repricing:
    """What the job's paid usage would cost under ``table``, per route and model, beside its stored cost.
    Reads only: the stored costs stay as they were.

    What-ifs: ``tier`` prices every real-time answer as if served at that service tier ("standard", "flex",
    "priority"...) instead of the one it reports; ``route`` prices every answer as if sent that way ("batch":
    through the Batch API). Rows stay per route the answers took."""
    long_above = {model: above for model in await storage.job_models(sessions, job_id=job_id)
                  if (above := table.long_above(model)) is not None}
    usage = await storage.usage_by_route(sessions, job_id=job_id, long_above=long_above)
    stored = await actual_cost(sessions=sessions, job_id=job_id)
    repriced = JobCost(totals=CostTotals(table=table))
    # Priced per route, model, long-prompt price and tier; shown per route and model.
    merged: dict[tuple[Route, str, bool, str | None], list[int]] = {}
    for row in usage:  # one row per route, model, length, tier and price table
        sums = merged.setdefault((row.route, row.model, row.long_prompt, row.service_tier), [0] * 8)
        for index, value in enumerate((row.prompts, row.prompt_tokens, row.completion_tokens, row.cached_tokens,
                                       row.cost_pico_usd, row.unpriced, row.cache_creation_tokens,
                                       row.cache_creation_extended_tokens)):
            sums[index] += value
    shown: dict[tuple[Route, str], RepricedRow] = {}
    for (sent, model, long, served), (requests, prompt_tokens, completion_tokens, cached_tokens, cost, unpriced,
                                      written, extended) in merged.items():
        again = repriced.totals.add(model=model, route=route or sent,
                                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                    cached_tokens=cached_tokens, cache_creation_tokens=written,
                                    cache_creation_extended_tokens=extended, requests=requests, long_prompt=long,
                                    service_tier=served if tier is None else tier)
        route_shown = sent
        priced = RepricedRow(route=route_shown, model=model, requests=requests, prompt_tokens=prompt_tokens,
                             completion_tokens=completion_tokens, cached_tokens=cached_tokens,
                             stored=from_pico(cost), stored_unpriced=unpriced, repriced=again)
        before = shown.get((route_shown, model))
        shown[(route_shown, model)] = priced if before is None else before.plus(priced)
    rows = list(shown.values())
    repriced.max_total = repriced.total
    return Repricing(job_id=job_id, rows=rows, stored=stored, repriced=repriced, tier=tier, route=route)
