"""The invariants, counted with SQL in the database once a scenario has settled; never from logs.

Every delivery row was written inside its closing transaction, so the
tables say what really committed: which orders closed, how often, when, and
which were paid. A cohort's lateness runs from its orders' deadlines to the
delivery (or, for a dead letter, to its burial), and for the bound from the
later of the deadline and the heal (for an order held by a payment in flight,
the payment's failure).

The payment scenarios have checks of their own: ``held_payment_checks``
(orders held by a payment in flight) and ``reminder_checks`` (the test shop's
``ReminderEmail`` rows and the app's ``Reminder`` records); the notices
scenario too, ``notice_checks``: the app's ``Notice`` rows, and what the
webhook target recorded (``chaos.sink``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import Field, Min, Model

from order_timeout import get_order_model
from order_timeout.models import DeadLetter, Deadline, Notice, Reminder
from testproject.shop.models import (
    OrderStatusChange,
    PlainOrder,
    ReminderEmail,
    Return,
    ShopOrder,
    StockRecord,
    StockReservation,
)

from .kinds import COMPLETIONS, PLAIN_PAYMENT, RESERVATIONS
from .models import Act, Delivery, Payment, Role, Settlement, ShopMove, Stranded, TimerRole
from .sink import body_field, without_attempt
from .story import Check, Cohort, Expect, KindCohort, Story

EPOCH = datetime(1970, 1, 1)


@dataclass
class CohortFigures:
    cohort: str
    expect: str
    orders: int
    closed: int
    dead_letters: int
    paid: int
    deleted: int
    # Orders that have not come to what their cohort expects.
    unsettled: int
    # Seconds from the deadline to the close (or burial): max and 99th percentile.
    late_max: float | None
    late_p99: float | None
    # Seconds from max(deadline, heal): what the bound holds.
    after_heal_max: float | None
    bound_seconds: float | None
    bound_text: str
    bound_path: str
    within_bound: bool
    # The three latest orders (id, seconds from the deadline): where to look first.
    latest: list[tuple[int, float]]
    # The latest close per second of deadlines (seconds after the cohort's first deadline).
    latest_by_second: dict[int, float]


@dataclass
class Verdict:
    figures: list[CohortFigures]
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def invariants_hold(self) -> bool:
        """Every check but the lateness bounds."""
        return all(check.ok for check in self.checks if not check.timing)


def _naive_utc(moment: datetime | None) -> datetime:
    """How MariaDB's DATETIME columns hold an instant (Django stores UTC, naive)."""
    return EPOCH if moment is None else moment.astimezone(UTC).replace(tzinfo=None)


class Tables:
    """Table and column names and the status values, for the SQL below."""

    def __init__(self) -> None:
        model = get_order_model()
        self.orders = model._meta.db_table
        pk = model._meta.pk
        assert pk is not None
        self.pk = pk.column
        status = model._meta.get_field(model.TIMEOUT_STATUS_FIELD)
        assert isinstance(status, Field)
        self.status = status.column
        self.closed = model.TIMEOUT_CLOSED_STATUS
        self.paid = model.TIMEOUT_PAID_STATUS
        self.unpaid = tuple(model.TIMEOUT_UNPAID_STATUSES)
        self.label = model._meta.label
        self.role = Role._meta.db_table
        self.delivery = Delivery._meta.db_table
        self.dead = DeadLetter._meta.db_table
        self.payment = Payment._meta.db_table
        self.settlement = Settlement._meta.db_table
        self.email = ReminderEmail._meta.db_table
        self.reminder = Reminder._meta.db_table
        self.stranded = Stranded._meta.db_table

    @property
    def unpaid_in(self) -> str:
        return "(" + ", ".join(["%s"] * len(self.unpaid)) + ")"

    def open_letter(self, order_id: str) -> str:
        """SQL: an open dead letter exists for the order whose id is the expression ``order_id``."""
        return (f"EXISTS (SELECT 1 FROM {self.dead} l WHERE l.order_model = %s "
                f"AND l.order_id = CAST({order_id} AS CHAR) AND l.resolved_at IS NULL)")


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def _count(sql: str, params: list[Any] | None = None) -> int:
    return int(_rows(sql, params or [])[0][0] or 0)


def _as_integer(expression: str) -> str:
    """SQL reading a text column as an integer, in the database's words: ``global_checks`` also
    judges the soak (chaos.soak), which runs on PostgreSQL too."""
    return f"CAST({expression} AS {'BIGINT' if connection.vendor == 'postgresql' else 'SIGNED'})"


# -- per cohort ---------------------------------------------------------------------


def cohort_counts(t: Tables) -> dict[str, dict[str, int]]:
    """orders, deleted, closed, paid, dead (unpaid with an open dead letter), unpaid per cohort."""
    sql = (f"SELECT r.cohort, COUNT(*), SUM(o.{t.pk} IS NULL), SUM(o.{t.status} = %s), "
           f"SUM(o.{t.status} = %s), SUM(o.{t.status} IN {t.unpaid_in} AND {t.open_letter('r.order_id')}), "
           f"SUM(o.{t.status} IN {t.unpaid_in}) "
           f"FROM {t.role} r LEFT JOIN {t.orders} o ON o.{t.pk} = r.order_id GROUP BY r.cohort")
    rows = _rows(sql, [t.closed, t.paid, *t.unpaid, t.label, *t.unpaid])
    names = ("orders", "deleted", "closed", "paid", "dead", "unpaid")
    return {row[0]: dict(zip(names, (int(value or 0) for value in row[1:]), strict=True))
            for row in rows}


def unsettled(expect: Expect, counts: dict[str, int]) -> int:
    present = counts["orders"] - counts["deleted"]
    if expect is Expect.CLOSED:
        return present - counts["closed"]
    if expect is Expect.CLOSED_OR_DEAD:
        return present - counts["closed"] - counts["dead"]
    if expect is Expect.PAID_OR_CLOSED:
        return present - counts["closed"] - counts["paid"]
    if expect is Expect.PAID:
        return present - counts["paid"]
    if expect is Expect.HELD:
        return present - (counts["unpaid"] - counts["dead"])
    return present


def lateness(t: Tables, cohort: str,
             heal_at: datetime | None) -> list[tuple[int, float, float, datetime]]:
    """(id, seconds from the deadline, from max(deadline, heal), deadline) per settled order of a cohort.

    Settled: its first delivery, or the burial of an unpaid order in an open dead letter.
    An order held by a payment in flight is healed when its payment failed (``Settlement``).
    """
    heal = _naive_utc(heal_at)
    since = "GREATEST(o.expires_at, %s, COALESCE(MAX(s.settled_at), o.expires_at))"
    settled = f"LEFT JOIN {t.settlement} s ON s.order_id = r.order_id "
    closes = (f"SELECT o.{t.pk}, o.expires_at, "
              f"TIMESTAMPDIFF(MICROSECOND, o.expires_at, MIN(d.delivered_at)), "
              f"TIMESTAMPDIFF(MICROSECOND, {since}, MIN(d.delivered_at)) "
              f"FROM {t.role} r JOIN {t.orders} o ON o.{t.pk} = r.order_id "
              f"JOIN {t.delivery} d ON d.order_id = r.order_id {settled}"
              f"WHERE r.cohort = %s GROUP BY o.{t.pk}, o.expires_at")
    burials = (f"SELECT o.{t.pk}, o.expires_at, "
               f"TIMESTAMPDIFF(MICROSECOND, o.expires_at, MAX(l.last_failed_at)), "
               f"TIMESTAMPDIFF(MICROSECOND, {since}, MAX(l.last_failed_at)) "
               f"FROM {t.role} r JOIN {t.orders} o ON o.{t.pk} = r.order_id "
               f"JOIN {t.dead} l ON l.order_model = %s AND l.order_id = CAST(r.order_id AS CHAR) "
               f"AND l.resolved_at IS NULL {settled}"
               f"WHERE r.cohort = %s AND o.{t.status} IN {t.unpaid_in} GROUP BY o.{t.pk}, o.expires_at")
    rows = _rows(f"{closes} UNION ALL {burials}",
                 [heal, cohort, heal, t.label, cohort, *t.unpaid])
    return [(int(pk), late / 1e6, after / 1e6, due) for pk, due, late, after in rows]


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def figures_of(t: Tables, cohort: Cohort, counts: dict[str, int], heal_at: datetime | None,
               scan_seconds: float) -> CohortFigures:
    late = lateness(t, cohort.name, heal_at)
    from_deadline = [row[1] for row in late]
    measured = [row[2] if cohort.bound and cohort.bound.from_heal else row[1] for row in late]
    bound = cohort.bound
    limit = bound.total(scan_seconds) if bound else None
    worst = max(measured, default=None)
    return CohortFigures(
        cohort=cohort.name, expect=cohort.expect.value, orders=counts["orders"],
        closed=counts["closed"], dead_letters=counts["dead"], paid=counts["paid"],
        deleted=counts["deleted"], unsettled=unsettled(cohort.expect, counts),
        late_max=max(from_deadline, default=None), late_p99=_p99(from_deadline),
        after_heal_max=worst, bound_seconds=limit,
        bound_text=bound.describe(scan_seconds) if bound else "",
        bound_path=bound.path if bound else "",
        within_bound=limit is None or worst is None or worst <= limit,
        latest=[(row[0], round(row[1], 3)) for row in sorted(late, key=lambda row: -row[1])[:3]],
        latest_by_second=_by_second(late),
    )


def _by_second(late: list[tuple[int, float, float, datetime]]) -> dict[int, float]:
    if not late:
        return {}
    first = min(row[3] for row in late)
    worst: dict[int, float] = {}
    for _, seconds, _, due in late:
        second = int((due - first).total_seconds())
        worst[second] = round(max(worst.get(second, 0.0), seconds), 2)
    return dict(sorted(worst.items()))


# -- the whole scenario ------------------------------------------------------------------


def global_checks(t: Tables) -> list[Check]:
    """What must hold in every scenario, whatever the fault."""
    paid_closed = _count(f"SELECT COUNT(DISTINCT o.{t.pk}) FROM {t.orders} o JOIN {t.delivery} d "
                         f"ON d.order_id = o.{t.pk} WHERE o.{t.status} = %s", [t.paid])
    twice = _count(f"SELECT COUNT(*) FROM (SELECT order_id FROM {t.delivery} GROUP BY order_id "
                   f"HAVING COUNT(*) > 1) twice")
    undelivered = _count(f"SELECT COUNT(*) FROM {t.orders} o WHERE o.{t.status} = %s AND NOT EXISTS "
                         f"(SELECT 1 FROM {t.delivery} d WHERE d.order_id = o.{t.pk})", [t.closed])
    unclosed = _count(f"SELECT COUNT(DISTINCT o.{t.pk}) FROM {t.orders} o JOIN {t.delivery} d "
                      f"ON d.order_id = o.{t.pk} WHERE o.{t.status} <> %s", [t.closed])
    early = _count(f"SELECT COUNT(*) FROM {t.orders} o JOIN {t.delivery} d ON d.order_id = o.{t.pk} "
                   f"WHERE d.delivered_at < o.expires_at")
    lost_payments = _count(
        f"SELECT COUNT(*) FROM {t.payment} p LEFT JOIN {t.orders} o ON o.{t.pk} = p.order_id "
        f"WHERE p.outcome = %s AND (o.{t.pk} IS NULL OR o.{t.status} <> %s OR EXISTS "
        f"(SELECT 1 FROM {t.delivery} d WHERE d.order_id = p.order_id))",
        [Payment.Outcome.PAID, t.paid])
    bad_refunds = _count(
        f"SELECT COUNT(*) FROM {t.payment} p LEFT JOIN {t.orders} o ON o.{t.pk} = p.order_id "
        f"WHERE p.outcome = %s AND (o.{t.pk} IS NULL OR o.{t.status} <> %s)",
        [Payment.Outcome.REFUND, t.closed])
    letters_of_settled = _count(
        f"SELECT COUNT(*) FROM {t.dead} l JOIN {t.orders} o ON o.{t.pk} = {_as_integer('l.order_id')} "
        f"WHERE l.order_model = %s AND l.resolved_at IS NULL AND o.{t.status} NOT IN {t.unpaid_in}",
        [t.label, *t.unpaid])
    return [
        Check("no paid order closed", paid_closed == 0, f"{paid_closed} paid orders have a delivery"),
        Check("a payment that committed never loses", lost_payments == 0,
              f"{lost_payments} orders whose mark_paid() returned True are not paid, or were closed"),
        Check("OrderClosed means closed (refund)", bad_refunds == 0,
              f"{bad_refunds} orders whose mark_paid() raised OrderClosed are not closed"),
        Check("no delivery committed twice", twice == 0, f"{twice} orders delivered more than once"),
        Check("every closed order has its delivery", undelivered == 0,
              f"{undelivered} closed orders without a delivery"),
        Check("no delivery without a close", unclosed == 0,
              f"{unclosed} orders delivered but not closed"),
        Check("nothing closed before its deadline (database clock)", early == 0,
              f"{early} deliveries before the deadline"),
        Check("no open dead letter for a settled order", letters_of_settled == 0,
              f"{letters_of_settled} open dead letters of paid or closed orders"),
    ]


def judge(story: Story, scan_seconds: float, more: list[Check]) -> Verdict:
    """Count everything once the scenario settled; ``more`` are checks made outside the database."""
    t = Tables()
    counts = cohort_counts(t)
    empty = {"orders": 0, "deleted": 0, "closed": 0, "paid": 0, "dead": 0, "unpaid": 0}
    figures = [figures_of(t, cohort, counts.get(cohort.name, empty), story.heal_at, scan_seconds)
               for cohort in story.cohorts]
    checks = global_checks(t)
    named = {cohort.name for cohort in story.cohorts}
    strays = sorted(set(counts) - named)
    checks.append(Check("every order is in a cohort the scenario judges", not strays,
                        f"cohorts not judged: {', '.join(strays)}"))
    if story.kinds:
        k = KindTables()
        counts_of_kinds = kind_counts(k)
        empty_kind = {"rows": 0, "acted": 0, "twice": 0, "settled": 0, "kept": 0, "acted_only": 0, "dead": 0}
        figures += [kind_figures(k, cohort, counts_of_kinds.get((cohort.timer, cohort.name), empty_kind),
                                 scan_seconds) for cohort in story.kinds]
        checks += kind_checks(k, story.kinds)
    for row in figures:
        checks.append(Check(f"{row.cohort}: every {'order' if ': ' not in row.cohort else 'row'} {row.expect}",
                            row.unsettled == 0, f"{row.unsettled} of {row.orders} are not"))
        if row.bound_seconds is not None:
            checks.append(Check(f"{row.cohort}: within the bound ({row.bound_path})", row.within_bound,
                                f"max {row.after_heal_max:.2f} s > {row.bound_seconds:.1f} s"
                                if row.after_heal_max is not None else "", timing=True))
    return Verdict(figures, [*checks, *more, *story.checks])


def all_settled(story: Story) -> bool:
    """Whether every cohort has come to what it expects (polled while waiting, so cheap).

    Only unpaid orders can still change; the dead letters are looked up only
    for cohorts that may end in one and still have unpaid orders. A held
    cohort's orders stay unpaid: nothing to wait for.
    """
    t = Tables()
    rows = _rows(f"SELECT r.cohort, COUNT(*) FROM {t.role} r JOIN {t.orders} o ON o.{t.pk} = r.order_id "
                 f"WHERE o.{t.status} IN {t.unpaid_in} GROUP BY r.cohort", list(t.unpaid))
    unpaid = {cohort: int(count) for cohort, count in rows}
    for cohort in story.cohorts:
        waiting = unpaid.get(cohort.name, 0)
        if cohort.expect is Expect.HELD:
            continue
        if waiting and cohort.expect is not Expect.CLOSED_OR_DEAD:
            return False
        if waiting and cohort_counts(t)[cohort.name]["dead"] < waiting:
            return False
    return kinds_settled(story)


# -- payments that take time ---------------------------------------------------------------


def held_payment_checks(payments: type[Model]) -> list[Check]:
    """The held-payments scenario: ``payments`` is the order model's payment model (``payments``).

    A payment's state changed, and its ``Settlement`` was written, in one
    transaction; ``settled_at`` comes just before its commit, so a close that
    saw the payment settled comes after it.
    """
    t = Tables()
    table = payments._meta.db_table
    order_column = payments._meta.get_field("order").column  # type: ignore[union-attr]
    while_pending = _count(
        f"SELECT COUNT(DISTINCT d.order_id) FROM {t.delivery} d "
        f"WHERE EXISTS (SELECT 1 FROM {table} p WHERE p.{order_column} = d.order_id) "
        f"AND NOT EXISTS (SELECT 1 FROM {t.settlement} s WHERE s.order_id = d.order_id "
        f"AND s.settled_at <= d.delivered_at)")
    refused = _count(
        f"SELECT COUNT(*) FROM {t.settlement} s LEFT JOIN {t.payment} p ON p.order_id = s.order_id "
        f"WHERE s.state = %s AND (p.order_id IS NULL OR p.outcome <> %s)",
        [Settlement.State.SUCCEEDED, Payment.Outcome.PAID])
    return [
        Check("no order closed while its payment was pending", while_pending == 0,
              f"{while_pending} orders delivered before their payment settled (or never settled)"),
        Check("mark_paid() returned True for every payment that succeeded", refused == 0,
              f"{refused} succeeded payments whose mark_paid() did not return True"),
    ]


def reminder_checks(leads_ms: list[int], owed_within: float) -> tuple[list[Check], dict[str, Any]]:
    """The reminders scenario: what ``ReminderEmail`` (one row per delivery, written in the
    reminder's transaction) and ``order_timeout.Reminder`` (the app's record) say.

    A reminder is *owed* to an order not paid by its moment plus ``owed_within``
    seconds (the consumer-death bound). Leads at least that long are owed under
    SIGKILL; a shorter one is not (a consumer killed holding it is taken over
    after the deadline, and the reminder dropped): a lost one must have been
    under lease when a consumer was killed (``Stranded``).
    """
    t = Tables()
    email = f"{t.email} e"
    same_reminder = ("m.order_model = e.model AND m.order_id = e.order_id "
                     "AND m.lead_ms = ROUND(e.seconds_left * 1000) AND m.deadline = e.deadline")
    twice = _count(f"SELECT COUNT(*) FROM (SELECT 1 FROM {email} WHERE e.model = %s "
                   f"GROUP BY e.order_id, e.seconds_left, e.deadline HAVING COUNT(*) > 1) twice", [t.label])
    unrecorded = _count(f"SELECT COUNT(*) FROM {email} WHERE e.model = %s AND NOT EXISTS "
                        f"(SELECT 1 FROM {t.reminder} m WHERE {same_reminder} AND m.outcome = %s)",
                        [t.label, Reminder.Outcome.SENT])
    undelivered = _count(f"SELECT COUNT(*) FROM {t.reminder} m WHERE m.order_model = %s AND m.outcome = %s "
                         f"AND NOT EXISTS (SELECT 1 FROM {email} WHERE {same_reminder})",
                         [t.label, Reminder.Outcome.SENT])
    after_payment = _count(
        f"SELECT COUNT(*) FROM {email} JOIN {t.payment} p ON CAST(p.order_id AS CHAR) = e.order_id "
        f"WHERE e.model = %s AND p.outcome = %s AND e.written_at > p.answered_at",
        [t.label, Payment.Outcome.PAID])
    after_close = _count(
        f"SELECT COUNT(*) FROM {email} JOIN {t.delivery} d ON CAST(d.order_id AS CHAR) = e.order_id "
        f"WHERE e.model = %s AND e.written_at > d.delivered_at", [t.label])
    late = _count(f"SELECT COUNT(*) FROM {t.reminder} m WHERE m.order_model = %s AND m.outcome = %s "
                  f"AND m.at >= m.deadline", [t.label, Reminder.Outcome.SENT])
    early = _count(f"SELECT COUNT(*) FROM {t.reminder} m WHERE m.order_model = %s AND m.outcome = %s "
                   f"AND m.at < TIMESTAMPADD(MICROSECOND, -1000 * m.lead_ms, m.deadline)",
                   [t.label, Reminder.Outcome.SENT])
    checks = [
        Check("no reminder delivered twice (order, reminder, deadline)", twice == 0,
              f"{twice} reminders delivered more than once"),
        Check("a reminder and its record commit together", unrecorded == 0 and undelivered == 0,
              f"{unrecorded} deliveries without a Reminder 'sent', {undelivered} records without a delivery"),
        Check("no reminder delivered after its order's payment committed", after_payment == 0,
              f"{after_payment} reminders delivered after mark_paid() returned True"),
        Check("no reminder delivered after its order closed", after_close == 0,
              f"{after_close} reminders delivered after the close"),
        Check("no reminder sent at or after its deadline (database clock)", late == 0,
              f"{late} reminders sent at or after the deadline"),
        Check("no reminder sent before its moment (database clock)", early == 0,
              f"{early} reminders sent before deadline - seconds_left"),
    ]
    facts: dict[str, Any] = {}
    owed_ms = round(1000 * owed_within)
    for lead in leads_ms:
        seconds = f"{lead / 1000:g} s"
        # Owed: the order was not paid by the moment plus the bound (nor, for a short lead, by the deadline).
        paid_by = min(owed_ms - lead, 0)
        owed = (f"FROM {t.role} r JOIN {t.orders} o ON o.{t.pk} = r.order_id "
                f"WHERE o.expires_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {t.payment} p "
                f"WHERE p.order_id = r.order_id AND p.outcome = %s "
                f"AND p.answered_at < TIMESTAMPADD(MICROSECOND, %s, o.expires_at))")
        delivered = (f"EXISTS (SELECT 1 FROM {email} WHERE e.model = %s "
                     f"AND e.order_id = CAST(r.order_id AS CHAR) AND ROUND(e.seconds_left * 1000) = %s "
                     f"AND e.deadline = o.expires_at)")
        owed_params = [Payment.Outcome.PAID, 1000 * paid_by]
        owed_count = _count(f"SELECT COUNT(*) {owed}", owed_params)
        missing = _count(f"SELECT COUNT(*) {owed} AND NOT {delivered}", [*owed_params, t.label, lead])
        sent = _count(f"SELECT COUNT(*) FROM {email} WHERE e.model = %s AND ROUND(e.seconds_left * 1000) = %s",
                      [t.label, lead])
        latest = _rows(f"SELECT MAX(TIMESTAMPDIFF(MICROSECOND, TIMESTAMPADD(MICROSECOND, -1000 * %s, "
                       f"e.deadline), e.written_at)) FROM {email} WHERE e.model = %s "
                       f"AND ROUND(e.seconds_left * 1000) = %s", [lead, t.label, lead])[0][0]
        latest_s = None if latest is None else int(latest) / 1e6
        facts[f"{seconds} reminders sent (owed)"] = f"{sent} ({owed_count})"
        if latest_s is not None:
            facts[f"{seconds} reminders: latest after its moment (s)"] = round(latest_s, 2)
        if lead >= owed_ms:
            checks += [
                Check(f"every {seconds} reminder owed was delivered", missing == 0,
                      f"{missing} of {owed_count} owed were not"),
                Check(f"{seconds} reminders within the bound (consumer death, {owed_within:g} s from "
                      f"the moment)", latest_s is None or latest_s <= owed_within,
                      f"latest {latest_s:.2f} s after its moment" if latest_s is not None else "", timing=True),
            ]
            continue
        unexplained = _count(
            f"SELECT COUNT(*) {owed} AND NOT {delivered} AND NOT EXISTS (SELECT 1 FROM {t.stranded} k "
            f"WHERE k.order_id = r.order_id AND k.lead_ms = %s)", [*owed_params, t.label, lead, lead])
        facts[f"{seconds} reminders lost to a kill"] = missing - unexplained
        # Not a correctness invariant: with no kill, a path over `lead` late (a busy machine) loses it too.
        checks.append(Check(f"a {seconds} reminder owed is lost only when a killed consumer held it",
                            unexplained == 0, f"{unexplained} of {owed_count} owed were lost, not held "
                            f"under a lease when a consumer was killed", timing=True))
    return checks, facts


# -- the shop's declared timers (every-kind) ---------------------------------------------------


class KindTables:
    """Table names of the shop's declared timers' models and of the harness's records of them."""

    def __init__(self) -> None:
        self.role, self.act, self.move = TimerRole._meta.db_table, Act._meta.db_table, ShopMove._meta.db_table
        self.reservation, self.stock = StockReservation._meta.db_table, StockRecord._meta.db_table
        self.order, self.change, self.returns = (ShopOrder._meta.db_table, OrderStatusChange._meta.db_table,
                                                 Return._meta.db_table)
        self.plain, self.deadline = PlainOrder._meta.db_table, Deadline._meta.db_table
        self.dead = DeadLetter._meta.db_table

    @property
    def acts(self) -> str:
        """Acts per row: ``(timer, object_id, acts, first)``."""
        return (f"(SELECT timer, object_id, COUNT(*) AS acts, MIN(acted_at) AS first FROM {self.act} "
                f"GROUP BY timer, object_id)")


# The moves by which the shop settles a row before its timer acts on it.
SETTLING_MOVES = ("completed", "returned", "paid")


def kind_counts(k: KindTables) -> dict[tuple[str, str], dict[str, int]]:
    """Per (timer, cohort): rows, acted (at least once), twice, settled by the shop, settled and
    never acted on, acted on and never settled, open dead letters."""
    settled = (f"EXISTS (SELECT 1 FROM {k.move} m WHERE m.timer = r.timer AND m.object_id = r.object_id "
               f"AND m.move IN ({', '.join(['%s'] * len(SETTLING_MOVES))}))")
    acted = "COALESCE(a.acts, 0) >= 1"
    sql = (f"SELECT r.timer, r.cohort, COUNT(*), SUM({acted}), SUM(COALESCE(a.acts, 0) > 1), SUM({settled}), "
           f"SUM(NOT {acted} AND {settled}), SUM({acted} AND NOT {settled}), "
           f"SUM(EXISTS (SELECT 1 FROM {k.dead} l WHERE l.timer = r.timer "
           f"AND l.order_id = CAST(r.object_id AS CHAR) AND l.resolved_at IS NULL)) "
           f"FROM {k.role} r LEFT JOIN {k.acts} a ON a.timer = r.timer AND a.object_id = r.object_id "
           f"GROUP BY r.timer, r.cohort")
    rows = _rows(sql, [*SETTLING_MOVES] * 3)
    names = ("rows", "acted", "twice", "settled", "kept", "acted_only", "dead")
    return {(row[0], row[1]): dict(zip(names, (int(value or 0) for value in row[2:]), strict=True))
            for row in rows}


def kind_unsettled(cohort: KindCohort, counts: dict[str, int]) -> int:
    if cohort.acted is True:
        return counts["rows"] - counts["acted_only"]
    if cohort.acted is False:
        return counts["rows"] - counts["kept"]
    return counts["rows"] - counts["kept"] - counts["acted_only"]


def kind_lateness(k: KindTables, cohort: KindCohort) -> list[tuple[int, float, float, datetime]]:
    """(id, seconds from the deadline to the act, from max(deadline, the heal move), deadline) per
    acted-on row of a cohort."""
    rows = _rows(
        f"SELECT r.object_id, r.deadline, TIMESTAMPDIFF(MICROSECOND, r.deadline, MIN(a.acted_at)), "
        f"TIMESTAMPDIFF(MICROSECOND, GREATEST(r.deadline, COALESCE(MAX(m.at), r.deadline)), MIN(a.acted_at)) "
        f"FROM {k.role} r JOIN {k.act} a ON a.timer = r.timer AND a.object_id = r.object_id "
        f"LEFT JOIN {k.move} m ON m.timer = r.timer AND m.object_id = r.object_id AND m.move = %s "
        f"WHERE r.timer = %s AND r.cohort = %s GROUP BY r.object_id, r.deadline",
        [cohort.heal_move or "", cohort.timer, cohort.name])
    return [(int(pk), late / 1e6, after / 1e6, due) for pk, due, late, after in rows]


def kind_figures(k: KindTables, cohort: KindCohort, counts: dict[str, int], scan_seconds: float) -> CohortFigures:
    late = kind_lateness(k, cohort)
    bound = cohort.bound
    measured = [row[2] if bound and bound.from_heal else row[1] for row in late]
    limit = bound.total(scan_seconds) if bound else None
    worst = max(measured, default=None)
    return CohortFigures(
        cohort=cohort.label, expect=cohort.expect, orders=counts["rows"], closed=counts["acted"],
        dead_letters=counts["dead"], paid=counts["settled"], deleted=0,
        unsettled=kind_unsettled(cohort, counts),
        late_max=max((row[1] for row in late), default=None), late_p99=_p99([row[1] for row in late]),
        after_heal_max=worst, bound_seconds=limit, bound_text=bound.describe(scan_seconds) if bound else "",
        bound_path=bound.path if bound else "", within_bound=limit is None or worst is None or worst <= limit,
        latest=[(row[0], round(row[1], 3)) for row in sorted(late, key=lambda row: -row[1])[:3]],
        latest_by_second=_by_second(late),
    )


def kind_checks(k: KindTables, cohorts: list[KindCohort]) -> list[Check]:
    """What must hold for the shop's declared timers, whatever the fault: each act once, none
    early, none of a row the shop had settled, and the shop's receivers' effects once per act."""
    twice = _count(f"SELECT COUNT(*) FROM {k.acts} a WHERE a.acts > 1")
    early = _count(f"SELECT COUNT(*) FROM {k.act} a JOIN {k.role} r ON r.timer = a.timer "
                   f"AND r.object_id = a.object_id WHERE a.acted_at < r.deadline")
    strays = _count(f"SELECT COUNT(*) FROM {k.act} a WHERE NOT EXISTS (SELECT 1 FROM {k.role} r "
                    f"WHERE r.timer = a.timer AND r.object_id = a.object_id)")
    judged = {(cohort.timer, cohort.name) for cohort in cohorts}
    unjudged = sorted(f"{timer}: {name}" for timer, name in _rows(f"SELECT DISTINCT timer, cohort FROM {k.role}", [])
                      if (timer, name) not in judged)
    # Reservations: the stock of every released one came back once, nobody else's.
    stock = _count(
        f"SELECT COUNT(*) FROM {k.stock} s LEFT JOIN (SELECT stockrecord_id, SUM(quantity) AS q "
        f"FROM {k.reservation} WHERE state = 'released' GROUP BY stockrecord_id) g ON g.stockrecord_id = s.id "
        f"WHERE s.num_in_stock - s.num_allocated <> COALESCE(g.q, 0)")
    released = _count(
        f"SELECT COUNT(*) FROM {k.reservation} x LEFT JOIN {k.acts} a ON a.timer = %s AND a.object_id = x.id "
        f"WHERE (x.state = 'released') <> (COALESCE(a.acts, 0) = 1)", [RESERVATIONS])
    while_completing = _count(
        f"SELECT COUNT(*) FROM {k.act} a WHERE a.timer = %s "
        f"AND EXISTS (SELECT 1 FROM {k.move} m WHERE m.timer = a.timer AND m.object_id = a.object_id "
        f"AND m.move = 'completing' AND m.at <= a.acted_at) "
        f"AND NOT EXISTS (SELECT 1 FROM {k.move} m WHERE m.timer = a.timer AND m.object_id = a.object_id "
        f"AND m.move = 'abandoned' AND m.at <= a.acted_at)", [RESERVATIONS])
    # Delivered orders: one status change per completion, none for an order with a return.
    changes = _count(
        f"SELECT COUNT(*) FROM {k.order} o LEFT JOIN (SELECT order_id, COUNT(*) AS n FROM {k.change} "
        f"WHERE old_status = 'Delivered' AND new_status = 'Complete' GROUP BY order_id) c ON c.order_id = o.id "
        f"LEFT JOIN {k.acts} a ON a.timer = %s AND a.object_id = o.id WHERE o.completes_at IS NOT NULL "
        f"AND (COALESCE(c.n, 0) <> COALESCE(a.acts, 0) OR (o.status = 'Complete') <> (COALESCE(a.acts, 0) = 1))",
        [COMPLETIONS])
    returned = _count(f"SELECT COUNT(DISTINCT a.object_id) FROM {k.act} a JOIN {k.returns} x "
                      f"ON x.order_id = a.object_id WHERE a.timer = %s", [COMPLETIONS])
    # PlainOrders: cancelled once, at the act; a payment either wins (paid, never cancelled) or is refused.
    cancelled = _count(
        f"SELECT COUNT(*) FROM {k.plain} p LEFT JOIN {k.acts} a ON a.timer = %s AND a.object_id = p.id "
        f"WHERE (p.status = 'cancelled') <> (COALESCE(a.acts, 0) = 1)", [PLAIN_PAYMENT])
    both = _count(
        f"SELECT COUNT(*) FROM {k.move} m JOIN {k.plain} p ON p.id = m.object_id "
        f"LEFT JOIN {k.acts} a ON a.timer = m.timer AND a.object_id = m.object_id WHERE m.timer = %s AND "
        f"((m.move = 'paid' AND (p.status <> 'paid' OR a.acts IS NOT NULL)) "
        f"OR (m.move = 'refused' AND (p.status <> 'cancelled' OR a.acts IS NULL OR a.first > m.at)))",
        [PLAIN_PAYMENT])
    deadlines_left = _count(f"SELECT COUNT(*) FROM {k.deadline} WHERE timer = %s", [PLAIN_PAYMENT])
    return [
        Check("no act of a declared timer committed twice", twice == 0, f"{twice} rows acted on more than once"),
        Check("no declared timer acted before its deadline (database clock)", early == 0,
              f"{early} acts before the deadline"),
        Check("every act of a declared timer is of a row the scenario judges", strays == 0 and not unjudged,
              f"{strays} acts of rows without a role; cohorts not judged: {', '.join(unjudged)}"),
        Check("every released reservation's stock given back once, no other's", stock == 0 and released == 0,
              f"{stock} stock records off by what their released reservations hold, "
              f"{released} reservations released without exactly one act (or the reverse)"),
        Check("no reservation released while its checkout was completing", while_completing == 0,
              f"{while_completing} released between their checkout's 'completing' and its end"),
        Check("one status change per completed order, none for another", changes == 0,
              f"{changes} delivered orders whose Complete status, status changes and acts disagree"),
        Check("no order completed once a return was opened", returned == 0, f"{returned} completed with a return"),
        Check("a PlainOrder is cancelled exactly when its timer acted", cancelled == 0,
              f"{cancelled} PlainOrders cancelled without exactly one act (or the reverse)"),
        Check("no PlainOrder both paid and cancelled: a payment wins, or is refused once it is cancelled", both == 0,
              f"{both} payments that won on a cancelled order, or were refused on one not cancelled"),
        Check("every PlainOrder deadline spent by its act or taken away by its payment", deadlines_left == 0,
              f"{deadlines_left} Deadline rows left"),
    ]


def kinds_settled(story: Story) -> bool:
    """Whether every declared timer's cohort has come to what it expects (polled while waiting)."""
    if not story.kinds:
        return True
    k = KindTables()
    counts = kind_counts(k)
    empty = {"rows": 0, "acted": 0, "twice": 0, "settled": 0, "kept": 0, "acted_only": 0, "dead": 0}
    return all(kind_unsettled(cohort, counts.get((cohort.timer, cohort.name), empty)) == 0
               for cohort in story.kinds if cohort.acted is not False)


# -- notices to the outside world (the notices scenario) ---------------------------------------


def notice_checks(requests: Sequence[Any], handler: str) -> tuple[list[Check], dict[str, Any]]:
    """What the ``Notice`` rows of ``handler`` and the target's record of ``requests`` (the sink's,
    ``chaos.sink.Request``) say: one notice per closed order and none for another, each delivered,
    each key accepted by the target at least once (none lost), every repeat the same key and body.
    A request its sender's death cut short (its body incomplete) is counted apart: no target acts
    on one.

    A notice's key is ``{handler}:{order model label, lower}:{pk}`` (``notify_expired``).
    """
    t = Tables()
    n = Notice._meta.db_table
    prefix = f"{handler}:{get_order_model()._meta.label_lower}:"
    without_one = _count(
        f"SELECT COUNT(*) FROM (SELECT o.{t.pk} FROM {t.orders} o LEFT JOIN {n} n ON n.handler = %s "
        f"AND n.`key` = CONCAT(%s, o.{t.pk}) WHERE o.{t.status} = %s GROUP BY o.{t.pk} "
        f"HAVING COUNT(n.id) <> 1) x", [handler, prefix, t.closed])
    of_unclosed = _count(
        f"SELECT COUNT(*) FROM {n} n LEFT JOIN {t.orders} o ON o.{t.pk} = CAST(n.object_id AS SIGNED) "
        f"WHERE n.handler = %s AND (o.{t.pk} IS NULL OR o.{t.status} <> %s OR n.object_model <> %s)",
        [handler, t.closed, t.label])
    undelivered = _count(f"SELECT COUNT(*) FROM {n} WHERE handler = %s AND state <> %s",
                         [handler, Notice.State.DELIVERED])
    wrong_key = _count(f"SELECT COUNT(*) FROM {n} WHERE handler = %s AND `key` <> CONCAT(%s, object_id)",
                       [handler, prefix])
    others = _count(f"SELECT COUNT(*) FROM {n} WHERE handler <> %s", [handler])
    total, attempts, most = _rows(f"SELECT COUNT(*), COALESCE(SUM(attempts), 0), COALESCE(MAX(attempts), 0) "
                                  f"FROM {n} WHERE handler = %s", [handler])[0]
    letters = DeadLetter.objects.filter(timer="notices")
    dead, dead_open = letters.count(), letters.filter(resolved_at__isnull=True).count()
    keys = set(Notice.objects.filter(handler=handler).values_list("key", flat=True))

    cut_short = sum(1 for request in requests if not request.complete)
    requests = [request for request in requests if request.complete]
    accepted = Counter(request.key for request in requests if request.accepted)
    lost = keys - set(accepted)
    strays = {request.key for request in requests} - keys
    repeated = {key: count for key, count in accepted.items() if count > 1}
    sent = Counter(request.key for request in requests)
    bodies: dict[str, set[bytes]] = defaultdict(set)
    keys_of_notice: dict[Any, set[str]] = defaultdict(set)
    for request in requests:
        bodies[request.key].add(request.body)
        # The header's key, and the one the body names (``default_body``).
        keys_of_notice[request.notice].update({request.key, body_field(request.body, "key")})
    differing = [key for key, seen in bodies.items() if len(seen) > 1]
    only_attempt = [key for key in differing if len({without_attempt(body) for body in bodies[key]}) == 1]
    rekeyed = [notice for notice, seen in keys_of_notice.items() if len(seen) > 1]
    unsigned = sum(1 for request in requests if not request.signed)
    checks = [
        Check("every closed order has exactly one notice", without_one == 0,
              f"{without_one} closed orders without exactly one {handler} notice"),
        Check("no notice of an order that was not closed", of_unclosed == 0,
              f"{of_unclosed} notices of orders not closed (or of no order)"),
        Check("a notice's idempotency key is its order's", wrong_key == 0, f"{wrong_key} notices keyed otherwise"),
        Check("every notice delivered (its row says so)", undelivered == 0, f"{undelivered} of {total} are not"),
        Check("no notice lost: the target accepted every notice's key at least once", not lost,
              f"{len(lost)} of {len(keys)} never accepted, e.g. {sorted(lost)[:3]}"),
        Check("the target got nothing but the notices' keys", not strays, f"{len(strays)} other keys"),
        Check("no notice dead-lettered", dead == 0, f"{dead} dead letters ({dead_open} open)"),
        Check("every request of a notice carries its key (Idempotency-Key and body alike)", not rekeyed,
              f"{len(rekeyed)} notices sent under more than one key"),
        Check("every repeat of a notice carries the same body", not differing,
              f"{len(differing)} keys sent with different bodies"
              + (f", {len(only_attempt)} of them differing only in 'attempt'" if only_attempt else "")
              + (f", e.g. {sorted(differing)[0]}" if differing else "")),
        Check("every request signed (SHOP_WEBHOOK_SECRET)", unsigned == 0, f"{unsigned} requests not signed"),
    ]
    facts: dict[str, Any] = {
        "notices (delivered)": f"{total} ({total - undelivered})",
        "requests to the target (accepted, refused)": f"{len(requests)} ({sum(accepted.values())}, "
                                                      f"{sum(1 for request in requests if not request.accepted)})",
        "keys sent more than once": sum(1 for count in sent.values() if count > 1),
        "duplicates accepted (keys)": f"{sum(repeated.values()) - len(repeated)} ({len(repeated)})",
        "lost": len(lost), "notice dead letters": dead,
        "attempts counted (most of one notice)": f"{attempts} ({most})",
    }
    if cut_short:
        facts["requests cut short by a kill"] = cut_short
    if others:
        facts["notices of other handlers"] = others
    return checks, facts


def notice_lateness(requests: Sequence[Any], handler: str) -> dict[int, tuple[float, float]]:
    """Per order whose notice the target accepted: its close (the first delivery row: the
    database's clock, in the closing transaction) and the first request of its notice the target
    accepted (the harness's clock, on the same machine), as POSIX timestamps."""
    prefix = f"{handler}:{get_order_model()._meta.label_lower}:"
    first: dict[int, float] = {}
    for request in requests:
        if request.accepted and request.key.startswith(prefix):
            pk = int(request.key[len(prefix):])
            first[pk] = min(first.get(pk, request.at), request.at)
    closed = dict(Delivery.objects.filter(order_id__in=list(first)).values_list("order_id")
                  .annotate(at=Min("delivered_at")))
    return {pk: (closed[pk].timestamp(), at) for pk, at in first.items() if pk in closed}
