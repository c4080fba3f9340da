"""Driver-level executemany for the hot write paths: plain tuples in the driver's own placeholder style.

SQLAlchemy's per-row parameter processing costs more than SQLite itself when results arrive by the
thousand; these statements skip it. A value that needs converting (a timestamp) goes through the
column type's own bind processor, so what is stored is what the ORM would store.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Dialect

__all__ = ["bind_value", "bind_processor", "placeholders"]


def placeholders(dialect: Dialect, n: int) -> list[str]:
    """``n`` parameter markers in the driver's paramstyle (SQLite ``?``, asyncpg ``$1``...)."""
    style = dialect.paramstyle
    if style == "qmark":
        return ["?"] * n
    if style == "numeric_dollar":
        return [f"${i}" for i in range(1, n + 1)]
    if style == "numeric":
        return [f":{i}" for i in range(1, n + 1)]
    if style == "format":
        return ["%s"] * n
    raise NotImplementedError(f"bulk writes for a driver with paramstyle {style!r}")


def bind_processor(column: Any, dialect: Dialect) -> Any:
    """The function SQLAlchemy applies to ``column``'s values for this driver, or None (values go as they are)."""
    return column.type.bind_processor(dialect)


def bind_value(column: Any, value: Any, dialect: Dialect) -> Any:
    """``value`` as SQLAlchemy would hand it to the driver for ``column``."""
    processor = bind_processor(column, dialect)
    return processor(value) if processor is not None else value
