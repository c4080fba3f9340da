"""The cost ledger: each result row carries what it cost, the price table it was priced with and the
discount applied. Existing rows are back-filled from their tokens with the bundled prices installed
now, and marked ``cost_basis = 'backfill'``: they are not the prices they were paid at.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from llm_dispatch.core import PriceTable

revision = "0004"
down_revision = "0003"

# Rows read and updated per round trip while back-filling.
PAGE = 5000
_COLUMNS = ("cost_pico_usd", "list_cost_pico_usd", "discount", "prices_as_of", "prices_file", "cost_basis")


def upgrade() -> None:
    # Plain ADD COLUMNs: SQLite adds them without copying the results table.
    op.add_column("results", sa.Column("cost_pico_usd", sa.BigInteger(), nullable=True))
    op.add_column("results", sa.Column("list_cost_pico_usd", sa.BigInteger(), nullable=True))
    op.add_column("results", sa.Column("discount", sa.String(length=16), nullable=True))
    op.add_column("results", sa.Column("prices_as_of", sa.String(length=10), nullable=True))
    op.add_column("results", sa.Column("prices_file", sa.String(), nullable=True))
    op.add_column("results", sa.Column("cost_basis", sa.String(length=16), nullable=True))
    _backfill(op.get_bind())


def _backfill(bind: sa.engine.Connection) -> None:
    """Price every existing row as the writers would have (the same formula, ``PriceTable.price``), by the model
    asked for."""
    prices = PriceTable.load()
    as_of = prices.prices_as_of
    # A failed call and a reused answer cost 0 under any table.
    bind.execute(
        sa.text("UPDATE results SET cost_pico_usd = 0, list_cost_pico_usd = 0, prices_as_of = :as_of, "
                "cost_basis = 'backfill' WHERE status <> 'succeeded' OR route = 'reused'"),
        {"as_of": as_of},
    )
    select = sa.text(
        "SELECT r.id, r.route, p.model, r.prompt_tokens, r.completion_tokens, r.cached_tokens "
        "FROM results r JOIN prompts p ON p.id = r.prompt_id "
        "WHERE r.status = 'succeeded' AND r.route <> 'reused' AND r.id > :after ORDER BY r.id LIMIT :page"
    )
    update = sa.text(
        "UPDATE results SET cost_pico_usd = :cost, list_cost_pico_usd = :list_cost, discount = :discount, "
        "prices_as_of = :as_of, cost_basis = 'backfill' WHERE id = :id"
    )
    after = 0
    while True:
        page = bind.execute(select, {"after": after, "page": PAGE}).all()
        if not page:
            return
        changes = []
        for id_, route, model, prompt_tokens, completion_tokens, cached_tokens in page:
            cost = None
            if prompt_tokens is not None and route in ("realtime", "batch"):
                cost = prices.price(model=model, route=route, prompt_tokens=prompt_tokens,
                                    completion_tokens=completion_tokens or 0, cached_tokens=cached_tokens or 0)
            # No price (or no usage): the cost stays unknown, NULL, never 0.
            changes.append({"id": id_, "as_of": as_of, "cost": None if cost is None else cost.cost,
                            "list_cost": None if cost is None else cost.list_cost,
                            "discount": None if cost is None else cost.discount})
        bind.execute(update, changes)
        after = page[-1][0]


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite >= 3.35), as 0003's downgrade.
    for column in reversed(_COLUMNS):
        op.drop_column("results", column)
