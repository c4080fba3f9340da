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
# What storage.usage_by_route sums from the results (answers and failures that reported usage, none reused), as it
# sums them: each column's SUM over the job's rows, 0 where there is none; the unknown costs counted.
BACKFILL = """
INSERT INTO ledger_deltas (job_id, route, service_tier, prices_as_of, prices_file, cost_basis, requests,
    prompt_tokens, completion_tokens, cached_tokens, cache_creation_tokens, cache_creation_extended_tokens,
    cost_pico_usd, list_cost_pico_usd, unpriced)
SELECT job_id, route, service_tier, prices_as_of, prices_file, cost_basis, count(*),
    coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0), coalesce(sum(cached_tokens), 0),
    coalesce(sum(cache_creation_tokens), 0), coalesce(sum(cache_creation_extended_tokens), 0),
    coalesce(sum(cost_pico_usd), 0), coalesce(sum(list_cost_pico_usd), 0), count(*) - count(cost_pico_usd)
FROM results
WHERE route != 'reused' AND (status IN ('succeeded', 'refused', 'invalid') OR prompt_tokens IS NOT NULL)
GROUP BY job_id, route, service_tier, prices_as_of, prices_file, cost_basis
"""


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
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in (
            "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_creation_tokens",
            "cache_creation_extended_tokens", "cost_pico_usd", "list_cost_pico_usd", "unpriced")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_ledger_deltas_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_deltas")),
    )
    op.create_index("ix_ledger_deltas_job_id", "ledger_deltas", ["job_id"], unique=False)
    op.execute(BACKFILL)


def downgrade() -> None:
    op.drop_index("ix_ledger_deltas_job_id", table_name="ledger_deltas")
    op.drop_table("ledger_deltas")
