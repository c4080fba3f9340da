"""Each prompt of an input routed as it is stored (its route, the reason and its deadline) and priced as it is checked:
the rows ``record_job`` stores, and a new job's estimate summed in its check pass."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

from llm_dispatch import storage
from llm_dispatch.core import (
    BACKENDS,
    ChatRequest,
    DEFAULT_OFFERS,
    EstimateSums,
    LaneOffer,
    PriceTable,
    PromptSpec,
    ProviderTable,
    Route,
    RoutingRules,
    decide_route,
    key_hash,
    parse_deadline,
    prompt_chars,
)

from ._cache_plan import JobPrefixes
from ._costs import _estimated_lane, counted_prompts

__all__ = ["CheckPassEstimate", "batchless_providers", "new_prompts"]


class _Router:
    """Routes prompts one at a time by ``rules`` as of ``now`` (None: all real-time): each its route, the reason and
    its deadline; a prompt with a deadline may take the lanes ``table`` offers its model and endpoint
    (``lane_offers``), looked up once each."""

    __slots__ = ("_batchless", "_now", "_offers", "_rules", "_table")

    def __init__(self, *, rules: RoutingRules | None, now: datetime, table: PriceTable | None,
                 without_batches: Mapping[str, str] | None = None) -> None:
        self._rules, self._now, self._table = rules, now, table
        self._offers: dict[tuple[str, str, bool], tuple[LaneOffer, ...]] = {}
        # Providers with no Batch API, each with why (``batchless_providers``): their prompts are planned real-time.
        self._batchless = without_batches or {}

    def route(self, spec: PromptSpec) -> tuple[Route, str, datetime | None]:
        deadline = parse_deadline(spec.deadline, now=self._now) if spec.deadline else None
        rules = self._rules
        if rules is None:
            return "realtime", "sent by the realtime-dispatch flow", deadline
        # A prompt that names its own service tier or background mode is sent as it says: the Batch API alone.
        own = "service_tier" in spec.params or "background" in spec.params
        key = (spec.model, spec.endpoint, own)
        offers = self._offers.get(key)
        if offers is None:
            found = self._table.lane_offers(model=spec.model, endpoint=spec.endpoint) if self._table is not None else ()
            offers = self._offers[key] = tuple(offer for offer in found if not own or offer.route == "batch") or DEFAULT_OFFERS
        decision = decide_route(urgency=spec.urgency, deadline=deadline, prompt_chars=prompt_chars(spec.messages),
                                now=self._now, rules=rules, offers=offers)
        if decision.route == "batch" and spec.provider in self._batchless:
            return "realtime", self._batchless[spec.provider], deadline
        return decision.route, decision.reason, deadline


def new_prompts(
    specs: Iterable[PromptSpec], *, rules: RoutingRules | None, now: datetime, table: PriceTable | None = None,
    without_batches: Mapping[str, str] | None = None,
) -> Iterator[storage.NewPrompt]:
    """Rows for the specs, one at a time, each routed by ``rules`` (None: all real-time) with its reason and deadline
    (``_Router``): a prompt of a provider in ``without_batches`` (``batchless_providers``) that would go to the
    Batch API is planned real-time, so that its estimate and budget are the price it is sent at."""
    router = _Router(rules=rules, now=now, table=table, without_batches=without_batches)
    for spec in specs:
        route, reason, deadline = router.route(spec)
        yield storage.NewPrompt(
            custom_id=spec.custom_id, position=spec.position, model=spec.model, messages=spec.messages,
            params=spec.params, metadata=spec.metadata, dedupe_key=spec.dedupe_key,
            planned_route=route, route_reason=reason, deadline=deadline, endpoint=spec.endpoint,
            provider=spec.provider,
        )


def batchless_providers(providers: Mapping[str, str] | ProviderTable) -> dict[str, str]:
    """The providers whose prompts never go in batches, each with why: a wire llm-dispatch has no batch backend for
    (``core.BACKENDS``), or a declared provider whose providers file says ``batch_api = false``."""
    if not isinstance(providers, ProviderTable):
        providers = ProviderTable(model_providers=providers)
    table = providers
    lacking: dict[str, str] = {}
    for name in table.names:
        provider = table.get(name)
        if provider.wire not in BACKENDS:
            lacking[name] = f"llm-dispatch has no {provider.wire} Batch API yet; sent real-time"
        elif provider.batch_api is False:
            lacking[name] = f"{name} has no Batch API (batch_api = false in the providers file); sent real-time"
    return lacking


class CheckPassEstimate:
    """A new job's cost estimate summed as its check reads the input (``PromptInput.check``'s ``each``): each prompt
    routed as it will be stored (``_Router``, the same rules and ``now``) and added at its lane, an identical request
    once per half when ``dedupe`` is on, as ``counted_prompts`` adds them while a job is stored whole. So a job stored
    while it is sent has its estimate (``--max-cost``, a budget's bounds) before its first request.

    ``seen`` counts the prompts added, ``batched`` those routed to the Batch API. An identical request is remembered
    by its 64-bit hash (``key_hash``) and half. ``prefixes``: given each prompt counted, for the cache plan's groups.
    """

    def __init__(self, *, table: PriceTable, rules: RoutingRules | None, now: datetime, dedupe: bool,
                 without_batches: Mapping[str, str] | None = None, prefixes: JobPrefixes | None = None) -> None:
        self.sums = EstimateSums(table=table)
        self.prefixes = prefixes
        self._router = _Router(rules=rules, now=now, table=table, without_batches=without_batches)
        self._dedupe = dedupe
        self._counted: set[int] = set()
        self.seen = self.batched = 0

    def __call__(self, spec: PromptSpec) -> None:
        self.seen += 1
        route, _, _ = self._router.route(spec)
        batch = route == "batch"
        self.batched += batch
        if self._dedupe:
            first = key_hash(spec.dedupe_key) * 2 + batch
            if first in self._counted:
                return
            self._counted.add(first)
        request = ChatRequest(model=spec.model, messages=spec.messages, params=spec.params, endpoint=spec.endpoint)
        self.sums.add(request, route=_estimated_lane(route))
        if self.prefixes is not None:
            self.prefixes.add(spec.position, request, route=route)
