"""A job's paid usage kept as it is written: ``ledger_deltas``, a row per write of results and ledger key (route,
service tier, price stamp) with what those results added, appended in the write's own transaction. ``status`` and
``cost`` sum a job's few delta rows instead of every result. The results already stored are summed into it here,
one row per job and key."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0023"

BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# The ledger key the results are grouped by, after the job.
KEY = ("route", "service_tier", "prices_as_of", "prices_file", "cost_basis")
SUMS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_creation_tokens",
        "cache_creation_extended_tokens", "cost_pico_usd", "list_cost_pico_usd", "unpriced")


def backfill(*, key: dict[str, str] | None = None, fixed: dict[str, str] | None = None, join: str = "") -> str:
    """What storage.usage_by_route sums from the results ``r`` (answers and failures that reported usage, none
    reused), as it sums them, into ledger_deltas: each column's SUM over the job's rows per ledger key, 0 where there
    is none; the unknown costs counted. ``key``: more columns to group by (column -> expression over ``join``);
    ``fixed``: columns given one value (column -> SQL literal)."""
    key, fixed = key or {}, fixed or {}
    grouped = [*key.values(), *(f"r.{name}" for name in KEY)]
    columns = ", ".join(("job_id", *key, *KEY, *fixed, *SUMS))
    tokens = ", ".join(f"coalesce(sum(r.{name}), 0)" for name in SUMS[1:-1])
    return f"""
INSERT INTO ledger_deltas ({columns})
SELECT r.job_id, {", ".join((*grouped, *fixed.values()))}, count(*), {tokens}, count(*) - count(r.cost_pico_usd)
FROM results r {join}
WHERE r.route != 'reused' AND (r.status IN ('succeeded', 'refused', 'invalid') OR r.prompt_tokens IS NOT NULL)
GROUP BY r.job_id, {", ".join(grouped)}
"""


BACKFILL = backfill()


def upgrade() -> None:
    op.create_table(
        "ledger_deltas",
        sa.Column("id", BigInt, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("route", sa.String(length=16), nullable=False),
        sa.Column("service_tier", sa.String(length=16), nullable=True),
        sa.Column("prices_as_of", sa.String(length=10), nullable=True),
        sa.Column("prices_file", sa.String(), nullable=True),
        sa.Column("cost_basis", sa.String(length=16), nullable=True),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in SUMS),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_ledger_deltas_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_deltas")),
    )
    op.create_index("ix_ledger_deltas_job_id", "ledger_deltas", ["job_id"], unique=False)
    op.execute(BACKFILL)


def downgrade() -> None:
    op.drop_index("ix_ledger_deltas_job_id", table_name="ledger_deltas")
    op.drop_table("ledger_deltas")
