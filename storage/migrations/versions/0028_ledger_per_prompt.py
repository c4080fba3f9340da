"""A job's ledger deltas kept per the prompts' model, endpoint and provider and per long-prompt split, so that
``status``, ``cost`` and ``reprice`` read every job's paid usage from them; the results' covering ledger index
(0021), which each result insert kept up, gives way to an index on results.job_id alone.

The deltas written before were per route, tier and price stamp only, which a job of several models cannot be split
by: they are made again from the results (0027's back-fill, grouped by the prompts' columns too). The threshold a
back-filled delta was split at is unknown (NULL, none): a read split by a long-prompt price sums that job's results.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"


def _sibling(name: str) -> ModuleType:
    """An earlier migration of this folder (they are files, not a package)."""
    spec = importlib.util.spec_from_file_location(f"migration_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BACKFILL = _sibling("0027_ledger_deltas").backfill(
    key={"model": "p.model", "endpoint": "p.endpoint", "provider": "p.provider"},
    fixed={"long_above": "NULL", "long_prompt": "false"}, join="JOIN prompts p ON p.id = r.prompt_id")


def upgrade() -> None:
    op.execute("DELETE FROM ledger_deltas")
    # SQLite adds a NOT NULL column without a default only by making the table again (empty now).
    with op.batch_alter_table("ledger_deltas",
                              recreate="always" if op.get_bind().dialect.name == "sqlite" else "auto") as batch:
        batch.add_column(sa.Column("model", sa.String(), nullable=False))
        batch.add_column(sa.Column("endpoint", sa.String(length=16), nullable=False))
        batch.add_column(sa.Column("provider", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("long_above", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("long_prompt", sa.Boolean(), nullable=False))
    op.execute(BACKFILL)
    op.create_index("ix_results_job_id", "results", ["job_id"], unique=False)
    op.drop_index("ix_results_job_id_ledger", table_name="results")


def downgrade() -> None:
    op.create_index("ix_results_job_id_ledger", "results", _sibling("0021_ledger_indexes").LEDGER, unique=False)
    op.drop_index("ix_results_job_id", table_name="results")
    # The rows stay: 0027's key is part of this one, and its reads sum a key's rows.
    with op.batch_alter_table("ledger_deltas") as batch:
        for name in ("long_prompt", "long_above", "provider", "endpoint", "model"):
            batch.drop_column(name)
