"""Bulk statements: ids in IN lists and rows in executemany calls of bounded size, driver-level
executemany over plain tuples in the driver's own placeholder style, and how many rows a statement changed.

SQLAlchemy's per-row parameter processing costs more than SQLite itself when rows arrive by the
thousand; the driver-level statements skip it. A value that needs converting (a timestamp, JSON) goes
through the column type's own bind processor, so what is stored is what the ORM would store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, Select, any_, bindparam, func, literal_column, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import CursorResult, Dialect, Result
from sqlalchemy.orm import InstrumentedAttribute

__all__ = ["IDS_CHUNK", "INSERT_BATCH", "IN_CHUNK", "bind_processor", "bind_value", "changed_rows", "chunks", "id_in",
           "placeholders"]

T = TypeVar("T")

# Rows per executemany: large enough to amortise round trips, small enough that one
# multi-VALUES statement stays under PostgreSQL's 32,767 bind parameters.
INSERT_BATCH = 1_000
# Ids per IN list: old SQLite builds allow only 999 bound variables per statement.
IN_CHUNK = 500
# Ids per ``id_in`` test: one bound value whatever the count (a JSON array, or a PostgreSQL array).
IDS_CHUNK = 10_000


def id_in(column: ColumnElement[Any] | InstrumentedAttribute[Any], values: Sequence[Any],
          dialect: Dialect) -> ColumnElement[bool]:
    """``column IN values`` as one bound value (SQLite: a JSON array read by ``json_each``; PostgreSQL: ``= ANY`` of
    an array of the column's type), so the statement is the same whatever the count: compiled once, and no literal
    list built per value. Each an index lookup, as an IN list is."""
    if dialect.name == "postgresql":
        return column == any_(bindparam("id_in", list(values), type_=ARRAY(column.type)))
    listed: Select[Any] = select(literal_column("value")).select_from(func.json_each(bindparam("id_in",
                                                                                                json.dumps(list(values)))))
    return column.in_(listed.scalar_subquery())


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size``; a generator is consumed a chunk at a time."""
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


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


def bind_processor(column: Any, dialect: Dialect) -> Callable[[Any], Any]:
    """The function SQLAlchemy applies to ``column``'s values for this driver (the identity when it applies none)."""
    return column.type.bind_processor(dialect) or _same


def bind_value(column: Any, value: Any, dialect: Dialect) -> Any:
    """``value`` as SQLAlchemy would hand it to the driver for ``column``."""
    return bind_processor(column, dialect)(value)


def changed_rows(result: Result[Any]) -> int:
    """The rows an UPDATE, INSERT or DELETE changed. ``AsyncSession.execute`` returns a ``CursorResult`` for one,
    as a connection's does, but is typed to return any ``Result``, which has no ``rowcount``."""
    return cast("CursorResult[Any]", result).rowcount


def _same(value: Any) -> Any:
    return value
