"""The lanes a prompt can go by besides a plain request: what each is (``Lane``, from the catalog's ``lanes``), and
which of them, with the Batch API, a model and endpoint can take (``lane_offers``), for the router to pick from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from .._status import Route

if TYPE_CHECKING:
    from ._pricing import ModelPrice

__all__ = ["DEFAULT_OFFERS", "LANE_PREFERENCE", "Lane", "LaneOffer", "lane_offers"]

# Among lanes of equal discount, the first of these: the Batch API holds no connection and takes no request slot, a
# background response none while it waits; flex holds one and may be refused for capacity.
LANE_PREFERENCE: tuple[Route, ...] = ("batch", "background-8h", "background-2h", "flex", "realtime")


@dataclass(frozen=True, slots=True, kw_only=True)
class Lane:
    """A discounted lane shorter than the Batch API's, as the catalog's ``lanes`` give it: the provider and
    endpoints that take it, how long an answer may take in it, and what it takes off the standard prices (a
    fraction, or a model's service tier of that name: a model without that tier has no such lane)."""

    name: Route
    provider: str
    endpoints: tuple[str, ...]
    window: timedelta
    source: str
    discount: Decimal | None = None
    tier: str | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneOffer:
    """A lane a prompt can take: how long an answer may take in it (None for the Batch API: the router's window)
    and the fraction it takes off the standard price."""

    route: Route
    window: timedelta | None
    discount: Decimal


# What a prompt can take when nothing more is known of its model: the Batch API at half price.
DEFAULT_OFFERS: tuple[LaneOffer, ...] = (LaneOffer(route="batch", window=None, discount=Decimal("0.5")),)


def lane_offers(
    lanes: Iterable[Lane], *, price: ModelPrice | None, provider: str | None, endpoint: str, batch_discount: Decimal
) -> tuple[LaneOffer, ...]:
    """The lanes a request to ``endpoint`` of a model (its ``price``, its ``provider``) can take, the Batch API's
    last: only lanes of its provider, for that endpoint, for a model with a price (and the lane's tier, where the
    lane bills at one). A model with no price (a vLLM model...) is offered the Batch API alone, at
    ``batch_discount``, as any model is."""
    if price is None:
        return (LaneOffer(route="batch", window=None, discount=batch_discount),)
    offers = []
    for lane in lanes:
        if lane.provider != provider or endpoint not in lane.endpoints:
            continue
        if lane.tier is None:
            discount = lane.discount
        else:
            tier = price.tiers.get(lane.tier)
            # A tier with its own prices has no one discount to rank it by: it is not offered.
            discount = None if tier is None or tier.input is not None or tier.multiplier != 1 else tier.discount
        if discount:
            offers.append(LaneOffer(route=lane.name, window=lane.window, discount=discount))
    return (*offers, LaneOffer(route="batch", window=None, discount=price.batch_discount))
