"""The reminders: ``deadline_approaching`` once per reminder of each unpaid order, before its deadline.

A kind whose key is ``(pk, lead_ms)``: one member per reminder of an order
(``codec.reminder_member``), due ``lead_ms`` before the order's deadline, on a
queue of its own (``{prefix}:remind:...``). What it says beyond the close:
a reminder is recorded (``models.Reminder``) in the transaction that sends
it, so a retried, taken-over or raced one finds its record; one whose order
is held at its moment is recorded as passed over, not sent; none is sent
after the deadline; giving up records it failed (no dead letter: staff need
not send a late reminder).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Model

from ..conf import settings
from ..db.locks import LockedOrders
from ..db.primary import on_primary
from ..db.templates import Statement
from ..db.two_trips import insert
from ..models import Reminder
from ..queue.keys import REMIND
from ..reporting import wording as words
from ..signals import deadline_approaching
from .closes import OnOrderModel
from .members import deadline_score, parse_reminder, reminder_member
from .outcome import Due, Key, Outcome
from .receivers import run_receiver

# At most this long a due reminder waits for others to gather (``Kind.gathers``). With one
# reminder per order on PostgreSQL, each consumer took turns between five closes and five
# reminders (5 ms a batch), and the closes' steady p99 was 2.6x the plain row's; gathered, 1.2x.
GATHER_SECONDS = 0.05


@dataclass
class Given:
    """What giving up on reminders did (``giving_up.Burial``'s shape)."""

    buried: list[Key] = field(default_factory=list)
    settled: list[Key] = field(default_factory=list)
    missing: list[Key] = field(default_factory=list)


class Reminders(OnOrderModel):
    name = "remind"
    queue_name = REMIND
    @property
    def wording(self) -> words.Wording:
        return words.REMINDERS

    @property
    def gathers(self) -> float:  # type: ignore[override]
        """A reminder may come a little late, never after its deadline: up to ``GATHER_SECONDS``
        (a tenth of the shortest lead, if less) of them gather between claims."""
        leads = settings.reminders()
        return min(GATHER_SECONDS, leads[-1] / 10_000) if leads else 0.0

    def describe(self, key: Key) -> str:
        return f"order={key[0]} seconds_left={key[1] / 1000:g}"

    def member(self, key: Key) -> str:
        return reminder_member(self.model, key[0], key[1])

    def parser(self) -> Callable[[str], Key]:
        return partial(parse_reminder, self.model)

    def row_of(self, key: Key) -> Any:
        return key[0]

    def follow(self, row: Any) -> tuple[dict[str, int], list[str]]:
        """One member per reminder: due its lead before the deadline of an order awaiting payment."""
        leads = settings.reminders()
        members = [reminder_member(self.model, row.pk, lead) for lead in leads]
        if not row.awaits_payment:
            return {}, members
        score = deadline_score(row.expires_at)
        return {member: score - lead for member, lead in zip(members, leads, strict=True)}, []


    def takes_instances(self) -> bool:
        """Instances for ``deadline_approaching``'s receivers (or a model that reads its status its
        own way); otherwise a batch of reminders is recorded from the orders' keys, status and
        deadline, and nothing is sent."""
        return deadline_approaching.has_listeners(self.model) or self.reads_its_status_its_own_way()

    def acts_in_two_trips(self) -> bool:
        """A batch locked as tuples: recording its reminders (one INSERT) is all its act."""
        return not self.takes_instances()

    def lock(self, manager: Any, pks: Any, also: Sequence[Statement] = ()) -> LockedOrders:
        """The orders, and (in the same round trip, after the lock) the reminders recorded for them."""
        pks = list(dict.fromkeys(pks))
        return super().lock(manager, pks, also=[_recorded(self.model, manager.db), *also])

    def judge(self, keys: Sequence[Key], locked: LockedOrders, outcome: Outcome) -> list[Due]:
        """Due: the order is unpaid, its deadline still ahead, the reminder's moment (deadline
        minus its lead) has come, and it is not recorded for this deadline yet. One held at
        its moment is due too, to be recorded as passed over. Each due reminder comes with its
        order, or (orders locked as tuples) with its deadline and whether it is held."""
        now = outcome.db_now = locked.db_now
        recorded = set(locked.also[0])
        instances = locked.instances
        due: list[Due] = []
        for key in keys:
            pk, lead = key
            order = locked.rows.get(pk)
            deadline = locked.deadlines.get(pk)
            if pk in locked.busy:
                outcome.busy.append(key)
            elif order is None:
                outcome.missing.append(key)
            elif (now is None or deadline is None or deadline <= now or pk in locked.settled
                  or not (order.awaits_payment if instances else pk in locked.pending)):
                outcome.settled.append(key)  # paid, closed, no deadline, or too late: never after it
            elif (str(pk), lead, deadline) in recorded:
                outcome.settled.append(key)
            elif deadline - timedelta(milliseconds=lead) > now:
                outcome.not_due[key] = deadline - timedelta(milliseconds=lead)
            else:
                held = pk in locked.held
                if held:
                    outcome.passed.append(key)
                else:
                    outcome.moments[key] = deadline - timedelta(milliseconds=lead)
                if instances:
                    order._timeout_held = held  # ``act`` records it passed over, and sends nothing
                    due.append((key, order))
                else:
                    due.append((key, (deadline, held)))
        return due

    def act(self, due: list[Due], now: datetime, progress: Any = None) -> None:
        """Record the reminders (one INSERT), then send the ones whose order is not held (orders
        locked as instances: some receiver takes them)."""
        model, using = self.model, self.using
        if not isinstance(due[0][1], Model):
            _record(model, using, [(key, deadline) for key, (deadline, _held) in due], now,
                    held={key for key, (_deadline, held) in due if held})
            if progress is not None:
                progress()
            return
        # ``judge`` marked the held orders (the lock's hold statement): passed over, recorded so.
        held = {key for key, order in due if order._timeout_held}
        _record(model, using, [(key, order.expires_at) for key, order in due], now, held=held)
        connection = connections[using]
        for key, order in due:
            if key in held:
                continue
            run_receiver(key, connection, partial(deadline_approaching.send, sender=model, order=order,
                                                  seconds_left=key[1] / 1000))
            if progress is not None:
                progress()

    def give_up(self, failures: Sequence[Any], now: datetime) -> Given:
        """Record them failed, so they are not sent later."""
        keys = [failure.key for failure in failures]
        model = self.model
        deadlines = dict(model._base_manager.filter(pk__in=[pk for pk, _lead in keys])
                         .exclude(expires_at=None).values_list("pk", "expires_at"))
        using = router.db_for_write(model)
        reminders = [(key, deadlines[key[0]]) for key in keys if key[0] in deadlines]
        with transaction.atomic(using=using):
            existing = set(Reminder.objects.using(using).filter(
                order_model=model._meta.label, order_id__in=[str(pk) for (pk, _lead), _ in reminders],
            ).values_list("order_id", "lead_ms", "deadline"))
            Reminder.objects.using(using).bulk_create([
                Reminder(order_model=model._meta.label, order_id=str(pk), lead_ms=lead, deadline=deadline,
                         outcome=Reminder.Outcome.FAILED, at=now)
                for (pk, lead), deadline in reminders if (str(pk), lead, deadline) not in existing])
        return Given(buried=keys)

    # -- when they fall due: before their orders' deadlines, and moot after them -----------------

    moot_past_deadline = True  # the close scan closes the order

    def falls_due_early(self) -> timedelta:
        return timedelta(milliseconds=max(settings.reminders(), default=0))

    def scores(self, rows: Sequence[tuple[Any, datetime]]) -> dict[str, int]:
        """The reminders of these orders not sent (nor passed over) for their deadline yet, due
        at their moment, which may be past already: then at once (the consumer looks again, and
        never sends one after its deadline)."""
        leads = settings.reminders()
        if not leads:
            return {}
        done = set(on_primary(Reminder).filter(
            order_model=self.model._meta.label, order_id__in=[str(pk) for pk, _ in rows],
        ).values_list("order_id", "lead_ms", "deadline"))
        return {reminder_member(self.model, pk, lead): deadline_score(expires_at) - lead
                for pk, expires_at in rows for lead in leads
                if (str(pk), lead, expires_at) not in done}


def _recorded(model: Any, using: str) -> Statement:
    """The reminders recorded for a batch's orders: ``(order_id, lead_ms, deadline)``."""
    label = model._meta.label
    return Statement(("recorded reminders", label), lambda pks: Reminder.objects.using(using).filter(
        order_model=label, order_id__in=[str(pk) for pk in pks]).values_list("order_id", "lead_ms", "deadline"))


def _record(model: Any, using: str, reminders: list[tuple[Key, datetime]], now: datetime, *,
            held: set[Key]) -> None:
    """One INSERT: each reminder done for its deadline (sent, or passed over), whoever looks again;
    sent with the COMMIT where the batch takes two round trips."""
    insert(Reminder, using, [
        Reminder(order_model=model._meta.label, order_id=str(pk), lead_ms=lead, deadline=deadline,
                 outcome=Reminder.Outcome.HELD if (pk, lead) in held else Reminder.Outcome.SENT, at=now)
        for (pk, lead), deadline in reminders])
