"""The budget ledger: named spending caps, their periods' spent and reserved money, and the reservations that
hold it, kept true with several processes at once on SQLite and PostgreSQL.

Every reservation is one conditional UPDATE of its period's row (``spent + reserved + amount <= limit``): the
database serialises them (PostgreSQL locks the row and checks the condition again on the row it locked; SQLite
has one writer), so the cap holds however many runs, shards and workers share it. A statement that changes a
period row and a reservation row changes the period row first, so two transactions never wait on each other
in opposite orders.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Final

from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from llm_dispatch.core import (
    BUDGET_PERIODS,
    ChatRequest,
    ConfigError,
    PriceTable,
    Route,
    job_budget_name,
    period_key,
    worst_case_cost,
)

from ._bulk import changed_rows
from ._engine import Sessions
from ._models import Budget, BudgetSpend, Reservation, utcnow

__all__ = [
    "LEASE_TTL",
    "BudgetInfo",
    "BudgetLease",
    "BudgetUsage",
    "budget_usage",
    "get_budget",
    "hold_for",
    "reclaim_expired",
    "release_batch",
    "release_holds",
    "settle_batch",
    "set_budget",
    "set_job_budget",
    "settle_holds",
]

# A run's lease not renewed for this long is given back to its budget by the next run that needs the money (its
# process died). Renewed at every reservation and every settled write, so a live run sending requests keeps it.
LEASE_TTL: Final = timedelta(minutes=30)
# While a period rolls over, a run waits this long between looks at its requests still out in the old one.
_ROLL_POLL_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class BudgetInfo:
    name: str
    limit_pico_usd: int
    per: str


@dataclass(frozen=True, slots=True)
class BudgetUsage:
    """One period of a budget: its limit, what was spent and what is reserved, in picodollars."""

    name: str
    per: str
    period: str
    limit_pico_usd: int
    spent_pico_usd: int
    reserved_pico_usd: int

    @property
    def left_pico_usd(self) -> int:
        return max(0, self.limit_pico_usd - self.spent_pico_usd - self.reserved_pico_usd)


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def set_budget(sessions: Sessions, *, name: str, limit_pico_usd: int, per: str) -> BudgetInfo:
    """Create budget ``name`` or change its limit and period; a new limit holds from the next reservation on."""
    if per not in BUDGET_PERIODS:
        raise ConfigError(f"a budget's period is one of {', '.join(BUDGET_PERIODS)}, not {per!r}")
    if limit_pico_usd < 0:
        raise ConfigError("a budget's limit must be 0 or more dollars")
    async with sessions.begin() as session:
        changed = await session.execute(
            update(Budget).where(Budget.name == name).values(limit_pico_usd=limit_pico_usd, per=per, updated_at=utcnow()))
        if changed_rows(changed) == 0:
            session.add(Budget(name=name, limit_pico_usd=limit_pico_usd, per=per))
    return BudgetInfo(name=name, limit_pico_usd=limit_pico_usd, per=per)


async def set_job_budget(sessions: Sessions, *, job_id: str, limit_pico_usd: int) -> BudgetInfo:
    """The budget ``--budget`` holds for one job, over its whole life: made (or its limit changed) here. A new one
    starts with what the job's stored answers cost already (its ledger deltas': results they omit cost 0)."""
    info = await set_budget(sessions, name=job_budget_name(job_id), limit_pico_usd=limit_pico_usd, per="total")
    async with sessions.begin() as session:
        # One statement (a write first): on SQLite a read before it could lose the write lock to another process.
        await (await session.connection()).execute(
            text("INSERT INTO budget_periods (budget, period, spent_pico_usd, reserved_pico_usd, updated_at) "
                 "SELECT :budget, 'total', COALESCE(SUM(cost_pico_usd), 0), 0, :now FROM ledger_deltas "
                 "WHERE job_id = :job ON CONFLICT DO NOTHING"),
            {"budget": info.name, "job": job_id, "now": utcnow()})
    return info


async def get_budget(sessions: Sessions, *, name: str) -> BudgetInfo | None:
    async with sessions() as session:
        found = await session.get(Budget, name)
    return None if found is None else BudgetInfo(name=found.name, limit_pico_usd=found.limit_pico_usd, per=found.per)


async def budget_usage(
    sessions: Sessions, *, name: str | None = None, now: datetime | None = None, history: bool = False
) -> list[BudgetUsage]:
    """Each budget's current period (``name``: that budget's only) with its limit, spent and reserved money;
    ``history`` adds every earlier period that spent or reserved anything, newest first."""
    stmt = select(Budget, BudgetSpend).outerjoin(BudgetSpend, BudgetSpend.budget == Budget.name).order_by(
        Budget.name, BudgetSpend.period.desc())
    if name is not None:
        stmt = stmt.where(Budget.name == name)
    async with sessions() as session:
        rows = (await session.execute(stmt)).all()
    found: list[BudgetUsage] = []
    current: dict[str, bool] = {}
    for budget, spend in rows:
        period = period_key(budget.per, now=now)
        current.setdefault(budget.name, False)
        if spend is not None and (spend.period == period or history):
            current[budget.name] |= spend.period == period
            found.append(BudgetUsage(name=budget.name, per=budget.per, period=spend.period,
                                     limit_pico_usd=budget.limit_pico_usd, spent_pico_usd=spend.spent_pico_usd,
                                     reserved_pico_usd=spend.reserved_pico_usd))
        if not current[budget.name] and (spend is None or spend.period < period):
            # Nothing spent in this period yet: shown at zero, before the older ones.
            current[budget.name] = True
            found.append(BudgetUsage(name=budget.name, per=budget.per, period=period,
                                     limit_pico_usd=budget.limit_pico_usd, spent_pico_usd=0, reserved_pico_usd=0))
    return sorted(found, key=lambda usage: (usage.name, usage.period != period_key(usage.per, now=now),
                                            _desc(usage.period)))


def _desc(period: str) -> tuple[int, ...]:
    return tuple(-ord(char) for char in period)


# --- the ledger's operations, each one transaction (or a statement of the caller's) ----------------------


async def _take(conn: AsyncConnection, *, budget: str, period: str, amount: int) -> bool:
    """Reserve ``amount`` on a period if it fits under the limit: one conditional UPDATE, so it holds under any
    number of processes. The period's row is made first when it is new."""
    now = utcnow()
    await conn.execute(text("INSERT INTO budget_periods (budget, period, spent_pico_usd, reserved_pico_usd, updated_at) "
                            "VALUES (:budget, :period, 0, 0, :now) ON CONFLICT DO NOTHING"),
                       {"budget": budget, "period": period, "now": now})
    limit = select(Budget.limit_pico_usd).where(Budget.name == budget).scalar_subquery()
    taken = await conn.execute(
        update(BudgetSpend)
        .where(BudgetSpend.budget == budget, BudgetSpend.period == period,
               BudgetSpend.spent_pico_usd + BudgetSpend.reserved_pico_usd + amount <= limit)
        .values(reserved_pico_usd=BudgetSpend.reserved_pico_usd + amount, updated_at=now))
    return taken.rowcount == 1


async def _move(conn: AsyncConnection, *, budget: str, period: str, spent: int, reserved: int) -> None:
    """Add ``spent`` to a period's spent money and ``reserved`` (negative: given back) to its reserved money."""
    await conn.execute(
        update(BudgetSpend).where(BudgetSpend.budget == budget, BudgetSpend.period == period)
        .values(spent_pico_usd=BudgetSpend.spent_pico_usd + spent,
                reserved_pico_usd=BudgetSpend.reserved_pico_usd + reserved, updated_at=utcnow()))


async def hold_for(
    sessions: Sessions,
    *,
    budget: BudgetInfo,
    amount: int,
    job_id: str | None = None,
    batch_id: int | None = None,
    ttl: timedelta | None = None,
    now: datetime | None = None,
    period: str | None = None,
) -> int | None:
    """Reserve ``amount`` on ``budget``'s current period (or ``period``) as a new reservation (a batch's, or a
    run's lease with ``ttl``); its id, or None when it does not fit."""
    period = period or period_key(budget.per, now=now)
    when = now or utcnow()
    async with sessions.begin() as session:
        conn = await session.connection()
        if not await _take(conn, budget=budget.name, period=period, amount=amount):
            return None
        made = await conn.execute(insert(Reservation).values(
            budget=budget.name, period=period, job_id=job_id, batch_id=batch_id, holder=_holder(),
            amount_pico_usd=amount, created_at=when, expires_at=None if ttl is None else when + ttl,
        ).returning(Reservation.id))
        return int(made.scalar_one())


async def settle_holds(conn: AsyncConnection, *, costs: dict[int, int]) -> None:
    """Turn reservations into spent money, in the caller's transaction (the one storing the answers): each
    reservation id -> the stored cost to count. Each moves at most what it holds from reserved to spent; a cost
    beyond it is spent all the same (the answer was paid), and a reservation already given back only spends."""
    # Each reservation is read locked (PostgreSQL; SQLite has one writer at a time), in id order: two transactions
    # settling one reservation at once (a batch's slices stored side by side) each move what the other left.
    for hold_id, cost in sorted(costs.items()):
        found = (await conn.execute(select(Reservation.budget, Reservation.period, Reservation.amount_pico_usd)
                                    .where(Reservation.id == hold_id).with_for_update())).first()
        if found is None:
            continue
        moved = min(cost, found.amount_pico_usd)
        await _move(conn, budget=found.budget, period=found.period, spent=cost, reserved=-moved)
        await conn.execute(update(Reservation).where(Reservation.id == hold_id)
                           .values(amount_pico_usd=Reservation.amount_pico_usd - moved))


async def settle_batch(conn: AsyncConnection, *, batch_id: int, cost: int) -> None:
    """Count ``cost`` (stored with a batch's answers) as spent out of the batch's reservation, in the caller's
    transaction; a batch that holds nothing (no budget) only counts where a reservation exists."""
    found = (await conn.execute(select(Reservation.id).where(Reservation.batch_id == batch_id))).scalars().first()
    if found is not None and cost:
        await settle_holds(conn, costs={found: cost})


async def release_batch(conn: AsyncConnection, *, batch_id: int) -> int:
    """Give back what a batch's reservation still holds (the batch ended: ingested, expired, cancelled, lost), in the
    caller's transaction; returns the picodollars given back."""
    given = 0
    for hold_id, budget, period, amount in (await conn.execute(
            select(Reservation.id, Reservation.budget, Reservation.period, Reservation.amount_pico_usd)
            .where(Reservation.batch_id == batch_id))).all():
        given += await _give_back(conn, hold_id=hold_id, budget=budget, period=period, amount=amount)
    return given


async def release_holds(sessions: Sessions, *, hold_ids: list[int]) -> int:
    """Give back what these reservations still hold, and delete them; returns the picodollars given back."""
    given = 0
    for hold_id in hold_ids:
        async with sessions.begin() as session:
            conn = await session.connection()
            found = (await conn.execute(select(Reservation.budget, Reservation.period, Reservation.amount_pico_usd)
                                        .where(Reservation.id == hold_id))).first()
            if found is None:
                continue
            given += await _give_back(conn, hold_id=hold_id, budget=found.budget, period=found.period,
                                      amount=found.amount_pico_usd)
    return given


async def _give_back(conn: AsyncConnection, *, hold_id: int, budget: str, period: str, amount: int,
                     expired_before: datetime | None = None) -> int:
    """Delete a reservation holding ``amount`` and give that back to its period (the period row first); nothing
    when it changed meanwhile (its holder settled some of it) or, with ``expired_before``, was renewed."""
    await _move(conn, budget=budget, period=period, spent=0, reserved=-amount)
    stmt = delete(Reservation).where(Reservation.id == hold_id, Reservation.amount_pico_usd == amount)
    if expired_before is not None:
        stmt = stmt.where(Reservation.expires_at < expired_before)
    if (await conn.execute(stmt)).rowcount == 1:
        return amount
    await _move(conn, budget=budget, period=period, spent=0, reserved=amount)
    return 0


async def reclaim_expired(sessions: Sessions, *, budget: str, now: datetime | None = None) -> int:
    """Give back the leases on ``budget`` whose runs stopped renewing them (a process that died holding money);
    returns the picodollars given back."""
    when = now or utcnow()
    async with sessions() as session:
        stale = (await session.execute(
            select(Reservation.id, Reservation.period, Reservation.amount_pico_usd)
            .where(Reservation.budget == budget, Reservation.expires_at.is_not(None), Reservation.expires_at < when)
        )).all()
    given = 0
    for hold_id, period, amount in stale:
        async with sessions.begin() as session:
            given += await _give_back(await session.connection(), hold_id=hold_id, budget=budget, period=period,
                                      amount=amount, expired_before=when)
    return given


class BudgetLease:
    """A run's hold on one budget for its real-time requests (a ``core.SpendGate``).

    Before each request, ``reserve`` holds its worst-case cost (``core.worst_case_cost`` at the route's price)
    out of the lease; the lease takes money from the budget's period ``block`` requests' worth at a time (one
    conditional UPDATE), and when a block no longer fits, just what the request needs; when even that does not
    fit, the lease is ``exhausted`` and nothing more is sent. The result writer counts each answer's stored cost
    (``buffered``), settles it in the transaction that stores the answer (``settle``), and then it leaves the
    lease (``settled``): what a lease holds in the database is always at least what its requests out and its
    answers not yet stored may cost. When the period rolls over (a new day or month) the lease waits for its
    requests of the old period to be stored, gives the rest back and goes on in the new one. On the way out it
    gives back whatever it still holds.
    """

    def __init__(
        self,
        sessions: Sessions,
        *,
        budget: BudgetInfo,
        prices: PriceTable,
        job_id: str | None = None,
        block: int = 64,
        route: Route = "realtime",
        ttl: timedelta = LEASE_TTL,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if block < 1:
            raise ValueError("block must be at least 1 request")
        self._sessions, self.budget, self._prices = sessions, budget, prices
        self._job_id, self._block, self._route, self._ttl, self._clock = job_id, block, route, ttl, clock
        self._id: int | None = None
        self._period = period_key(budget.per, now=clock())
        self.held = 0  # in the database for this lease
        self.out = 0  # worst cases of requests reserved and not yet landed
        self.unsettled = 0  # stored costs of answers received and not yet committed
        self._exhausted = False
        self._refill = asyncio.Lock()
        # The next block, taken while the last one still lasts (so requests do not wait for it); stopped near the
        # cap, where each request takes just what it needs.
        self._ahead: asyncio.Task[None] | None = None
        self._tight = False

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    @property
    def free(self) -> int:
        return self.held - self.out - self.unsettled

    async def __aenter__(self) -> BudgetLease:
        await reclaim_expired(self._sessions, budget=self.budget.name, now=self._clock())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Give back what the lease holds (call once its writer has stored everything)."""
        if self._ahead is not None:
            await self._ahead
            self._ahead = None
        await self._release()

    async def _release(self) -> None:
        if self._id is not None:
            await release_holds(self._sessions, hold_ids=[self._id])
            self._id, self.held = None, 0

    def worst_case(self, request: ChatRequest) -> int:
        """The most ``request`` can cost, in picodollars; a ``ConfigError`` when that has no bound or no price."""
        worst = worst_case_cost(request=request, route=self._route, table=self._prices)
        if worst is None or worst[1] is None:
            why = ("no max_tokens and no maximum output known" if worst is None else "no price")
            raise ConfigError(f"cannot hold budget {self.budget.name!r}: {why} for model {request.model}; give "
                              "the prompts max_tokens, or add the model to a price file (LLM_DISPATCH_PRICES_FILE)")
        return worst[1].cost

    async def reserve(self, request: ChatRequest) -> int | None:
        if self._exhausted:
            return None
        return await self.reserve_amount(self.worst_case(request))

    async def reserve_amount(self, amount: int) -> int | None:
        """Hold ``amount`` picodollars (a cost that is no request: an explicit cache's create and storage), as
        ``reserve`` holds a request's worst case; None when it does not fit."""
        if self._exhausted:
            return None
        if period_key(self.budget.per, now=self._clock()) != self._period:
            await self._roll()
        if self.free < amount:
            async with self._refill:
                if self.free < amount and not (await self._grow(amount * self._block)
                                               or await self._grow(amount - self.free)):
                    self._exhausted = True
                    return None
        self.out += amount
        block = amount * self._block
        if self.free < block // 2 and not self._tight and (self._ahead is None or self._ahead.done()):
            self._ahead = asyncio.create_task(self._top_up(block))
        return amount

    async def _top_up(self, block: int) -> None:
        """Take the next block before this one runs out; near the cap (it does not fit), stop taking ahead."""
        async with self._refill:
            if self.free < block // 2 and not self._exhausted and not await self._grow(block):
                self._tight = True

    def landed(self, amount: int) -> None:
        self.out -= amount

    async def hand_over(self, *, batch_id: int, amount: int) -> None:
        """Move ``amount``, reserved for requests now in batch ``batch_id``, from this lease to a reservation of the
        batch's own, held until the batch ends (``settle_batch`` as its answers are stored, ``release_batch``)."""
        self.out -= amount
        if self._id is None or amount <= 0:
            return
        now = self._clock()
        async with self._sessions.begin() as session:
            conn = await session.connection()
            moved = await conn.execute(
                update(Reservation).where(Reservation.id == self._id, Reservation.amount_pico_usd >= amount)
                .values(amount_pico_usd=Reservation.amount_pico_usd - amount, expires_at=now + self._ttl))
            if moved.rowcount != 1:
                return  # given back as expired meanwhile: the batch goes without a hold of its own
            await conn.execute(insert(Reservation).values(
                budget=self.budget.name, period=self._period, job_id=self._job_id, batch_id=batch_id,
                holder=_holder(), amount_pico_usd=amount, created_at=now, expires_at=None))
        self.held -= amount

    def buffered(self, cost: int) -> None:
        """The writer received answers whose stored cost is ``cost``."""
        self.unsettled += cost

    async def settle(self, conn: AsyncConnection, *, cost: int) -> int | None:
        """Count ``cost`` as spent, in the writer's transaction; returns what moved out of the lease's hold (None:
        the lease was given back as expired), for ``settled`` once that transaction commits."""
        moved = min(cost, self.held)
        if self._id is None:
            if cost:
                await _move(conn, budget=self.budget.name, period=self._period, spent=cost, reserved=0)
            return 0
        if cost:
            await _move(conn, budget=self.budget.name, period=self._period, spent=cost, reserved=-moved)
        renewed = await conn.execute(update(Reservation).where(Reservation.id == self._id).values(
            amount_pico_usd=Reservation.amount_pico_usd - moved, expires_at=self._clock() + self._ttl))
        if renewed.rowcount != 1:
            # Given back as expired meanwhile: the money was no longer held, so this only spends.
            await _move(conn, budget=self.budget.name, period=self._period, spent=0, reserved=moved)
            return None
        return moved

    def settled(self, *, cost: int, moved: int | None) -> None:
        self.unsettled -= cost
        if moved is None:
            self._id, self.held = None, 0
        else:
            self.held -= moved

    async def _grow(self, amount: int) -> bool:
        if amount <= 0:
            return True
        now = self._clock()
        if self._id is None:
            made = await hold_for(self._sessions, budget=self.budget, amount=amount, job_id=self._job_id,
                                  ttl=self._ttl, now=now, period=self._period)
            if made is None:
                return await self._reclaimed() and await self._grow(amount)
            self._id, self.held = made, self.held + amount
            return True
        async with self._sessions.begin() as session:
            conn = await session.connection()
            if not await _take(conn, budget=self.budget.name, period=self._period, amount=amount):
                taken = False
            else:
                taken = True
                grown = await conn.execute(update(Reservation).where(Reservation.id == self._id).values(
                    amount_pico_usd=Reservation.amount_pico_usd + amount, expires_at=now + self._ttl))
                if grown.rowcount != 1:
                    # Given back as expired meanwhile: what this lease held is gone; hold the new money anew.
                    anew = await conn.execute(insert(Reservation).values(
                        budget=self.budget.name, period=self._period, job_id=self._job_id, holder=_holder(),
                        amount_pico_usd=amount, created_at=now, expires_at=now + self._ttl,
                    ).returning(Reservation.id))
                    self._id, self.held = int(anew.scalar_one()), 0
        if taken:
            self.held += amount
            return True
        return await self._reclaimed() and await self._grow(amount)

    async def _reclaimed(self) -> bool:
        """Whether giving back other runs' expired leases freed anything (then it is worth trying again)."""
        return await reclaim_expired(self._sessions, budget=self.budget.name, now=self._clock()) > 0

    async def _roll(self) -> None:
        """A new period began: once this lease's requests of the old one are stored, give its rest back there."""
        async with self._refill:
            new = period_key(self.budget.per, now=self._clock())
            if new == self._period:
                return
            while self.out or self.unsettled:
                await asyncio.sleep(_ROLL_POLL_S)
            await self._release()  # not close(): a block being taken ahead waits for this lock
            self._period = new

