"""The order row: the truth about whether an order is unpaid, paid or closed.

Redis only mirrors it. Every state change here is a conditional UPDATE on the
status, so a payment and a timeout racing for the same row are serialised by
the database and exactly one of them wins.

A shop keeps its own order model and its own status field: it inherits
``TimeoutOrderMixin`` and declares which of its values mean unpaid, paid and
closed, the way ``AbstractBaseUser`` declares ``USERNAME_FIELD``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .conf import settings
from .db.apart import insert_apart
from .db.columns import auto_now_values
from .exceptions import OrderClosed, Refused, StaleOrderStatus
from .redaction import masked, one_line
from .signals import timeout_state_changed

logger = logging.getLogger("order_timeout")

# close_reason of an order closed by its deadline, and of one whose hold (a payment
# in flight, HOLD_CONDITION) ran past MAX_HOLD.
TIMEOUT_REASON = "timeout"
HOLD_EXPIRED_REASON = "hold_expired"
# The order close by the name staff see it under (a refused write's timer, a pause's).
CLOSE_TIMER = "close"


class Status(models.TextChoices):
    UNPAID = "unpaid", _("Unpaid")
    PAID = "paid", _("Paid")
    CLOSED = "closed", _("Closed")


def default_deadline() -> datetime:
    """Now plus ``ORDER_TIMEOUT['DEFAULT_TIMEOUT']`` seconds."""
    return timezone.now() + timedelta(seconds=settings.DEFAULT_TIMEOUT)


class PolicyFailed(Exception):
    """``DEADLINE_POLICY`` raised for an order, or answered something that is not a deadline."""


def policy_answer(order: TimeoutOrderMixin) -> datetime | None:
    """What ``DEADLINE_POLICY`` answers for ``order`` now, checked: an aware datetime, or None (it
    never expires). ``PolicyFailed`` saying why when it raises or answers anything else; no policy:
    now plus ``DEFAULT_TIMEOUT``."""
    policy = settings.deadline_policy()
    if policy is None:
        return default_deadline()
    try:
        deadline = policy(order)
    except Exception as exc:
        raise PolicyFailed(f"DEADLINE_POLICY {settings.DEADLINE_POLICY} raised for {type(order).__name__} "
                           f"{order.pk!r}") from exc
    if deadline is None or (isinstance(deadline, datetime) and timezone.is_aware(deadline)):
        return deadline
    raise PolicyFailed(f"DEADLINE_POLICY {settings.DEADLINE_POLICY} answered {deadline!r} for "
                       f"{type(order).__name__} {order.pk!r}, not an aware datetime or None")


def policy_deadline(order: TimeoutOrderMixin) -> datetime | None:
    """The deadline ``DEADLINE_POLICY`` gives ``order`` now (None: it never expires).

    Without a policy, now plus ``DEFAULT_TIMEOUT``. A policy that raises, or
    answers something that is not an aware datetime or None, costs the order
    nothing: it gets now plus ``DEFAULT_TIMEOUT``, and the reason is logged.
    Checkout never fails because of the policy, and no order is left without
    a deadline by accident.
    """
    try:
        return policy_answer(order)
    except PolicyFailed as exc:
        if exc.__cause__ is not None:
            logger.error("%s; it gets the default deadline (DEFAULT_TIMEOUT) instead.", exc, exc_info=exc.__cause__)
        else:
            logger.error("%s; it gets the default deadline (DEFAULT_TIMEOUT) instead.", exc)
        return default_deadline()


class DeadlineIndex(models.Index):
    """The ``(status field, expires_at)`` index, on whatever field the model names as its status.

    The field is only known once the concrete model exists, so it is filled in
    when Django names the index. Migrations see a plain ``models.Index``.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("fields", ["status", "expires_at"])
        super().__init__(**kwargs)

    def set_name_with_model(self, model: type[models.Model]) -> None:
        self.fields = [getattr(model, "TIMEOUT_STATUS_FIELD", "status"), "expires_at"]
        self.fields_orders = [(name, "") for name in self.fields]
        super().set_name_with_model(model)

    def deconstruct(self) -> Any:
        _path, args, kwargs = super().deconstruct()
        return "django.db.models.Index", args, kwargs

    def clone(self) -> models.Index:
        """A plain Index: what migrations hold, so the autodetector sees no change."""
        _path, args, kwargs = self.deconstruct()
        return models.Index(*args, **kwargs)


class TimeoutOrderMixin(models.Model):
    """Give an existing order model a payment deadline, keeping its own status field and values.

    Adds only ``expires_at`` (NULL: no deadline, never scheduled or scanned),
    ``closed_at``, ``close_reason`` and the ``(status field, expires_at)``
    index. Declare how the model's own status field says unpaid, paid and
    closed; every other value is settled: never scheduled, never closed, and
    free to move to any other settled value, except the draft values, which
    come before unpaid.
    """

    # The name of the model's own status field; the mixin never defines it.
    TIMEOUT_STATUS_FIELD: ClassVar[str] = "status"
    # Values before unpaid (a draft, a quote, an unconfirmed checkout): no deadline runs; a
    # save that moves the order from one of them into an unpaid value starts its deadline.
    TIMEOUT_DRAFT_STATUSES: ClassVar[tuple[str, ...]] = ()
    # The values in which the deadline runs.
    TIMEOUT_UNPAID_STATUSES: ClassVar[tuple[str, ...]] = ("unpaid",)
    # What mark_paid() writes.
    TIMEOUT_PAID_STATUS: ClassVar[str] = "paid"
    # What a timeout close writes.
    TIMEOUT_CLOSED_STATUS: ClassVar[str] = "closed"
    # The field that names an order to people and API clients (an order code, a number): what a
    # refusal's message and 409, a refused write, its log line and the admin call the order. None:
    # the primary key. For a name computed from several fields, override ``timeout_public_name()``.
    TIMEOUT_PUBLIC_NAME: ClassVar[str | None] = None

    expires_at = models.DateTimeField(
        _("payment deadline"), null=True, blank=True,
        help_text=_("An unpaid order is closed once this moment has passed; empty: no deadline."),
    )
    closed_at = models.DateTimeField(_("closed at"), null=True, blank=True)
    close_reason = models.CharField(_("close reason"), max_length=32, blank=True, default="")

    # (status, deadline) as this copy last read or wrote them, and as Redis was last told.
    _db_state: tuple[Any, Any]
    _queue_state: tuple[Any, Any]

    class Meta:
        abstract = True
        # The compensation scan and the admin's "overdue" view walk this index.
        indexes = [DeadlineIndex()]

    # -- reading the status -------------------------------------------------

    @property
    def timeout_status(self) -> Any:
        """The value of the model's own status field."""
        return getattr(self, self.TIMEOUT_STATUS_FIELD)

    def timeout_public_name(self) -> str:
        """The order as people and API clients know it: ``TIMEOUT_PUBLIC_NAME``'s value, or the
        primary key."""
        field = self.TIMEOUT_PUBLIC_NAME
        return str(self.pk if field is None else getattr(self, field))

    @property
    def is_unpaid(self) -> bool:
        return self.timeout_status in self.TIMEOUT_UNPAID_STATUSES

    @property
    def awaits_payment(self) -> bool:
        """Unpaid with a deadline: the order belongs on the queue."""
        return self.is_unpaid and self.expires_at is not None

    @classmethod
    def unpaid_q(cls) -> Q:
        """Rows in an unpaid status."""
        return Q(**{f"{cls.TIMEOUT_STATUS_FIELD}__in": cls.TIMEOUT_UNPAID_STATUSES})

    @classmethod
    def closing_values(cls, now: datetime, reason: str = TIMEOUT_REASON) -> dict[str, Any]:
        """The columns a timeout close writes: the status, ``closed_at``, ``close_reason``, and the
        shop's own fields ``ORDER_TIMEOUT['CLOSE_FIELDS']`` names (the time or the reason)."""
        # The model's auto_now fields too (Saleor's updated_at): a bare UPDATE would leave them stale.
        values = {**auto_now_values(cls, now),
                  cls.TIMEOUT_STATUS_FIELD: cls.TIMEOUT_CLOSED_STATUS, "closed_at": now, "close_reason": reason}
        for name, what in settings.CLOSE_FIELDS.items():
            values[name] = now if what == "time" else reason
        return values

    # -- what this copy and the queue last saw ----------------------------------

    @classmethod
    def from_db(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().from_db(*args, **kwargs)
        instance._remember_db_state()
        instance._queue_state = instance._db_state
        return instance

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        """Read the row again: this copy is no longer stale (a later save is judged on this read)."""
        super().refresh_from_db(*args, **kwargs)
        self._remember_db_state()

    def _timeout_state(self) -> tuple[Any, Any]:
        return (self.__dict__.get(self.TIMEOUT_STATUS_FIELD), self.__dict__.get("expires_at"))

    def _remember_db_state(self) -> None:
        """Status and deadline as this copy last read or wrote them, so a save can tell it is stale."""
        self._db_state = self._timeout_state()

    def _apply_close(self, values: dict[str, Any]) -> None:
        """This copy was closed by ``values`` in the database (by the consumer or the scan)."""
        for name, value in values.items():
            setattr(self, name, value)
        self._remember_db_state()

    def queue_state_changed(self) -> bool:
        """Whether status or deadline differ from what Redis was last told (at a commit)."""
        return getattr(self, "_queue_state", None) != self._timeout_state()

    # -- saving ----------------------------------------------------------------

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save, refusing a status write that would reopen a closed order or unsettle a settled one.

        A new unpaid order saved without a deadline gets ``DEFAULT_TIMEOUT``,
        and so does a draft moved into an unpaid status, from that moment
        (unless the same save gives it a deadline of its own). For an existing
        row the row is locked and read first, so the check cannot race the
        consumer, and a deadline this copy did not touch is not written back
        over one moved meanwhile (by ``extend_deadline()`` on another copy): a
        save never moves a deadline the row does not hold. Moves between
        settled values are the shop's business.
        """
        if self._state.adding and self.expires_at is None and self.is_unpaid:
            self.expires_at = policy_deadline(self)
        update_fields = kwargs.get("update_fields")
        writes_status = update_fields is None or self.TIMEOUT_STATUS_FIELD in update_fields
        writes_deadline = update_fields is None or "expires_at" in update_fields
        using = kwargs.get("using") or self._state.db or router.db_for_write(type(self), instance=self)
        if self._state.adding or self.pk is None:
            super().save(*args, **kwargs)
            self._remember_db_state_on_commit(using, self._timeout_state())
            return
        if not (writes_status or writes_deadline):
            super().save(*args, **kwargs)
            return
        with transaction.atomic(using=using):
            current = (type(self)._base_manager.db_manager(using).select_for_update()
                       .filter(pk=self.pk).values_list(self.TIMEOUT_STATUS_FIELD, "expires_at", "closed_at")
                       .first())
            if current is not None and writes_status:
                try:
                    self._refuse_unsafe_move(*current)
                except Refused as refusal:
                    if current[0] == self.TIMEOUT_CLOSED_STATUS:  # a close this save would undo
                        RefusedWrite.record(refusal, self._close_fields_written(update_fields))
                    raise
            if current is not None and writes_deadline:
                self._keep_a_deadline_moved_meanwhile(current[1])
            if current is not None and writes_status and self._enters_unpaid(current):
                self.expires_at = policy_deadline(self)
                if update_fields is not None and "expires_at" not in update_fields:
                    kwargs["update_fields"] = [*update_fields, "expires_at"]
                    writes_deadline = True
            super().save(*args, **kwargs)
            if current is not None:
                # What the row holds now: what this save wrote, the rest as read under the lock.
                self._remember_db_state_on_commit(using, (
                    self.timeout_status if writes_status else current[0],
                    self.expires_at if writes_deadline else current[1]))

    def clean(self) -> None:
        """Model validation (a ModelForm, the admin): a status move ``save()`` would refuse is the
        form's own error, not a server error when it saves. ``save()`` checks again under the row
        lock, which decides."""
        super().clean()
        if self._state.adding or self.pk is None:
            return
        using = self._state.db or router.db_for_read(type(self), instance=self)
        current = (type(self)._base_manager.db_manager(using).filter(pk=self.pk)
                   .values_list(self.TIMEOUT_STATUS_FIELD, "expires_at", "closed_at").first())
        if current is not None:
            self._refuse_unsafe_move(*current)

    def _close_fields_written(self, update_fields: Iterable[str] | None) -> dict[str, Any]:
        """What this copy would have written over the close's own columns (status, ``closed_at``,
        ``close_reason``, ``CLOSE_FIELDS``): the values of a refused save, for staff."""
        names = [self.TIMEOUT_STATUS_FIELD, "closed_at", "close_reason", *settings.CLOSE_FIELDS]
        if update_fields is not None:
            names = [name for name in names if name in update_fields]
        return {name: getattr(self, name) for name in names}

    def _remember_db_state_on_commit(self, using: str, state: tuple[Any, Any]) -> None:
        """Only a committed save changes what the row holds: after a rollback the copy's
        changes are still its own, to be written by the next save."""

        def remember() -> None:
            self._db_state = state

        transaction.on_commit(remember, using=using)

    def _never_scheduled(self, current: tuple[Any, Any, Any]) -> bool:
        """The row never had a deadline and was never closed: whatever its status, it never went
        through the queue (a draft, or an order a framework created in a status of its own)."""
        status, deadline, closed_at = current
        return deadline is None and closed_at is None and status != self.TIMEOUT_CLOSED_STATUS

    def _enters_unpaid(self, current: tuple[Any, Any, Any]) -> bool:
        """A draft, or a row never scheduled, in the row; unpaid in this save; and no deadline of
        its own given by the save: the deadline starts now."""
        return ((current[0] in self.TIMEOUT_DRAFT_STATUSES or self._never_scheduled(current))
                and current[0] not in self.TIMEOUT_UNPAID_STATUSES and self.is_unpaid
                and self.expires_at == current[1])

    def _keep_a_deadline_moved_meanwhile(self, current: Any) -> None:
        loaded = getattr(self, "_db_state", (None, None))[1]
        if self.expires_at == loaded and current != loaded:
            self.expires_at = current

    def _refuse_unsafe_move(self, current: Any, deadline: Any = None, closed_at: Any = None) -> None:
        """Refuse moving a row back into an unpaid status once the queue was done with it: closed by
        its deadline, or scheduled and then settled. A row that never went through the queue (no
        deadline ever, never closed: a draft, a framework's own first status) may enter unpaid
        from any status, and its deadline starts then."""
        new = self.timeout_status
        if new == current:
            return
        row = self._refusal_names()
        name = f"{type(self).__name__} {row['public_name']}"
        unpaid = self.TIMEOUT_UNPAID_STATUSES
        if new in unpaid and current not in unpaid and current not in self.TIMEOUT_DRAFT_STATUSES \
                and not self._never_scheduled((current, deadline, closed_at)):
            if closed_at is not None or current == self.TIMEOUT_CLOSED_STATUS:
                case = (f"it was closed by its deadline{f' at {closed_at:%Y-%m-%d %H:%M:%S %Z}' if closed_at else ''}"
                        f" and a closed order is not reopened")
            else:
                case = (f"it was scheduled (deadline {deadline:%Y-%m-%d %H:%M:%S %Z}) and then settled as "
                        f"{current!r}, which is not before payment: a settled order does not go back on the "
                        f"queue (if {current!r} does come before payment, declare it in "
                        f"{type(self).__name__}.TIMEOUT_DRAFT_STATUSES)")
            raise StaleOrderStatus(
                f"{name} is {current!r} in the database; refusing to move it back to the unpaid "
                f"status {new!r}: {case}.", **row)
        if current != self.TIMEOUT_CLOSED_STATUS:
            return
        if new == self.TIMEOUT_PAID_STATUS:
            raise OrderClosed(f"{name} was closed by its deadline; it cannot be paid now.", **row)
        if getattr(self, "_db_state", (None, None))[0] != current:
            # This copy still thought the order open: its author never saw the close.
            raise StaleOrderStatus(
                f"{name} is {current!r} (closed) in the database since this copy was loaded; "
                f"refusing to move it to {new!r}.", **row)

    def _refusal_names(self) -> dict[str, Any]:
        """What a refusal of this row's write carries: its model, its key, its public name, and the close."""
        return {"model_label": self._meta.label, "pk": self.pk, "timer": CLOSE_TIMER,
                "public_name": self.timeout_public_name()}

    # -- payment and deadline ------------------------------------------------

    def _conditional_update(self, **values: Any) -> bool:
        """UPDATE this row only while it is unpaid; True if it was.

        When it was not, the row is read again with a lock: a locking read
        sees the latest committed row under any isolation level, where a plain
        read inside the caller's REPEATABLE READ transaction would see its
        snapshot ("still unpaid") and answer wrongly.
        """
        using = self._state.db or router.db_for_write(type(self), instance=self)
        manager = type(self)._base_manager.db_manager(using)
        updated = manager.filter(self.unpaid_q(), pk=self.pk).update(**values)
        if updated:
            for name, value in values.items():
                setattr(self, name, value)
            self._remember_db_state()
            return True
        with transaction.atomic(using=using):
            current = (manager.select_for_update().filter(pk=self.pk)
                       .values_list(self.TIMEOUT_STATUS_FIELD, flat=True).first())
        if current is None:
            raise type(self).DoesNotExist(f"{type(self).__name__} {self.pk!r} does not exist.")
        setattr(self, self.TIMEOUT_STATUS_FIELD, current)
        self._remember_db_state()
        if current == self.TIMEOUT_CLOSED_STATUS:
            names = self._refusal_names()
            raise OrderClosed(f"{type(self).__name__} {names['public_name']} was already closed.", **names)
        return False

    def mark_paid(self, **fields: Any) -> bool:
        """Write ``TIMEOUT_PAID_STATUS`` (with any extra ``fields``) and take the order off the queue.

        Returns True when this call paid it and False when it was already
        settled otherwise (a retried payment callback). Raises ``OrderClosed``
        when the deadline closed it first: the payment must then be refunded, and a
        ``RefusedWrite`` says so to staff, whatever the caller does with the refusal.
        """
        values = {self.TIMEOUT_STATUS_FIELD: self.TIMEOUT_PAID_STATUS, **fields}
        try:
            paid = self._conditional_update(**values)
        except OrderClosed as refusal:
            RefusedWrite.record(refusal, values)
            raise
        if paid:
            timeout_state_changed.send(sender=type(self), orders=[self])
        return paid

    def extend_deadline(self, until: datetime | None) -> bool:
        """Move the deadline of an unpaid order to ``until``, later or earlier, and reschedule it.

        Earlier takes effect in Redis at once; later is taken up at the old
        deadline, when a consumer reads the row and moves the member on (Redis
        never holds a later deadline than the row). None takes the deadline
        away: the order no longer expires. Its reminders move with it. Returns
        False when the order is settled (paid); raises ``OrderClosed`` when it
        was closed first. After a change the policy cares about (the customer
        chose another payment method): ``order.extend_deadline(order.policy_deadline())``.
        """
        if until is not None and timezone.is_naive(until):
            raise ValueError("extend_deadline() needs an aware datetime (or None: no deadline).")
        extended = self._conditional_update(expires_at=until)
        if extended:
            timeout_state_changed.send(sender=type(self), orders=[self])
        return extended

    # The async faces run the sync path through sync_to_async, as Django's asave() does, so
    # the conditional UPDATE and the on-commit scheduling stay one path.

    async def amark_paid(self, **fields: Any) -> bool:
        """``mark_paid()`` for async views and webhooks: the same return value, and the same
        ``OrderClosed`` when the deadline won (refund)."""
        return await sync_to_async(self.mark_paid)(**fields)

    async def aextend_deadline(self, until: datetime | None) -> bool:
        """``extend_deadline()`` for async code: the same return value and exceptions
        (``OrderClosed``, ``ValueError`` for a naive ``until``)."""
        return await sync_to_async(self.extend_deadline)(until)

    def policy_deadline(self) -> datetime | None:
        """The deadline ``DEADLINE_POLICY`` gives this order now (``policy_deadline(order)``)."""
        return policy_deadline(self)


class AbstractTimeoutOrder(TimeoutOrderMixin):
    """A whole order model: the mixin plus a ``status`` field of its own and ``created_at``.

    For shops starting from scratch; a shop with an order model of its own
    inherits ``TimeoutOrderMixin`` instead and keeps its status field.
    """

    Status = Status

    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.UNPAID
    )
    # No field default: save() asks DEADLINE_POLICY (or DEFAULT_TIMEOUT) for an unpaid
    # order created without one, and a policy may answer None (never expires).
    expires_at = models.DateTimeField(
        _("payment deadline"), null=True, blank=True,
        help_text=_("An unpaid order is closed once this moment has passed; empty: no deadline."),
    )
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    class Meta(TimeoutOrderMixin.Meta):
        abstract = True


class Order(AbstractTimeoutOrder):
    """The ready-made order model, for shops that have none of their own yet."""

    class Meta(AbstractTimeoutOrder.Meta):
        verbose_name = _("order")
        verbose_name_plural = _("orders")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Order {self.pk} ({self.status})"


def statuses_of(model: type[TimeoutOrderMixin]) -> Iterable[Any]:
    """Every status value the model declares, unpaid first."""
    return (*model.TIMEOUT_UNPAID_STATUSES, model.TIMEOUT_PAID_STATUS, model.TIMEOUT_CLOSED_STATUS)


class DeadLetter(models.Model):
    """An order whose close failed on every retry: it left Redis and waits for staff.

    Requeue puts the order back on the queue; "Close now" runs the consumer's
    close path once more. Either way the row's status is checked under its
    lock first, so an order paid meanwhile is never closed.
    """

    class Resolution(models.TextChoices):
        REQUEUED = "requeued", _("Requeued")
        CLOSED = "closed", _("Closed now")
        SETTLED = "settled", _("Already paid or closed")
        # A notice staff chose not to deliver (the outside world needs it no more).
        DROPPED = "dropped", _("Dropped, not delivered")

    order_model = models.CharField(_("order model"), max_length=100)
    order_id = models.CharField(_("order id"), max_length=64)
    # The kind of timer whose act kept failing: "" for the order close, else a declared
    # timer's name (order_model and order_id then name that timer's row).
    # db_default too: a consumer of 0.2 (which knows no timers) writes its dead letters without
    # this column while both releases run on the new schema.
    timer = models.CharField(_("timer"), max_length=64, blank=True, default="", db_default="")
    attempts = models.PositiveIntegerField(_("attempts"))
    error_type = models.CharField(_("error type"), max_length=255)
    last_error = models.TextField(_("last error"), blank=True)
    first_failed_at = models.DateTimeField(_("first failure"))
    last_failed_at = models.DateTimeField(_("last failure"))
    resolved_at = models.DateTimeField(_("resolved at"), null=True, blank=True)
    resolved_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL, verbose_name=_("resolved by"), null=True, blank=True,
        on_delete=models.SET_NULL, related_name="+",
    )
    resolution = models.CharField(
        _("resolution"), max_length=16, choices=Resolution.choices, blank=True, default=""
    )

    class Meta:
        verbose_name = _("dead letter")
        verbose_name_plural = _("dead letters")
        ordering = ["-last_failed_at"]
        indexes = [
            models.Index(fields=["order_model", "order_id"]),
            # The prune deletes the resolved ones by age.
            models.Index(fields=["resolved_at"], name="order_timeout_deadletter_age"),
        ]
        permissions = [
            ("requeue_deadletter", _("Can requeue a dead letter")),
            ("close_deadletter_order", _("Can close a dead letter's order now")),
        ]

    def __str__(self) -> str:
        return f"{self.order_model} {self.order_id} ({self.attempts} attempts)"

    @property
    def is_resolved(self) -> bool:
        return self.resolved_at is not None


class Reminder(models.Model):
    """One reminder of one order's deadline, done: written in the transaction that sent it
    (``deadline_approaching``), or that passed it over.

    One row per order, reminder and deadline, so a reminder retried, taken
    over or raced by two consumers reaches its receivers once; a deadline
    moved by ``extend_deadline()`` gets its reminders again.
    """

    class Outcome(models.TextChoices):
        SENT = "sent", _("Sent")
        # The order was held at that moment (a payment in flight): not sent, and not later.
        HELD = "held", _("Not sent: payment in flight")
        # A receiver raised on every retry.
        FAILED = "failed", _("Failed")

    order_model = models.CharField(_("order model"), max_length=100)
    order_id = models.CharField(_("order id"), max_length=64)
    # The ORDER_TIMEOUT["REMINDERS"] entry, in milliseconds before the deadline.
    lead_ms = models.BigIntegerField(_("milliseconds before the deadline"))
    deadline = models.DateTimeField(_("deadline"))
    outcome = models.CharField(_("outcome"), max_length=16, choices=Outcome.choices)
    at = models.DateTimeField(_("at"))

    class Meta:
        verbose_name = _("reminder")
        verbose_name_plural = _("reminders")
        ordering = ["-at"]
        constraints = [models.UniqueConstraint(fields=["order_model", "order_id", "lead_ms", "deadline"],
                                               name="order_timeout_reminder_once")]
        # The prune deletes them by their deadline's age.
        indexes = [models.Index(fields=["deadline"], name="order_timeout_reminder_age")]

    def __str__(self) -> str:
        return f"{self.order_model} {self.order_id}: {self.lead_ms / 1000:g} s before {self.deadline}"


class Deadline(models.Model):
    """The deadline of one row for one declared timer, for a model whose table the shop cannot
    change (a framework's, another system's): the timer's ``deadline`` is None, and
    ``timer.set_deadline(row, at)`` writes here. Gone once the timer acted on the row, or found it
    no longer pending; kept while its settled condition settles it (settled is not final)."""

    timer = models.CharField(_("timer"), max_length=64)
    object_id = models.CharField(_("object id"), max_length=64)
    expires_at = models.DateTimeField(_("deadline"))

    class Meta:
        verbose_name = _("deadline")
        verbose_name_plural = _("deadlines")
        constraints = [models.UniqueConstraint(fields=["timer", "object_id"], name="order_timeout_deadline_once")]
        # The scan and the rebuild walk each timer's deadlines in order.
        indexes = [models.Index(fields=["timer", "expires_at"], name="order_timeout_deadline_walk")]

    def __str__(self) -> str:
        return f"{self.timer} {self.object_id}: {self.expires_at}"


class TimeoutOverview(models.Model):
    """No table: the admin's "Order timeouts" page, and the permission to see it."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        verbose_name = _("order timeouts")
        verbose_name_plural = _("order timeouts")


class Notice(models.Model):
    """A notice to the outside world (an e-mail, a webhook, an SMS), written by ``notify()`` in the
    transaction of the change it tells of, and delivered by its handler at least once afterwards.

    The transactional outbox: the row exists exactly when that change committed. ``key`` is the
    idempotency key every attempt hands the target; ``payload`` is JSON, or a reference to the
    object it is about (``object_model``, ``object_id``), loaded again at delivery.
    """

    class State(models.TextChoices):
        PENDING = "pending", _("Pending")
        DELIVERED = "delivered", _("Delivered")
        # Its handler's pending condition no longer held when it was due (the SMS confirmed).
        DROPPED = "dropped", _("Dropped")

    handler = models.CharField(_("handler"), max_length=100)
    key = models.CharField(_("idempotency key"), max_length=255)
    payload = models.JSONField(_("payload"), default=dict, blank=True)
    object_model = models.CharField(_("object model"), max_length=100, blank=True, default="")
    object_id = models.CharField(_("object id"), max_length=64, blank=True, default="")
    due_at = models.DateTimeField(_("due at"))
    state = models.CharField(_("state"), max_length=16, choices=State.choices, default=State.PENDING)
    # Attempts started (counted before each delivery, so a process that died mid-delivery counts).
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)
    # The last attempt's error, and what a target that refused it for good answered.
    last_error = models.TextField(_("last error"), blank=True, default="")
    last_answer = models.TextField(_("last answer"), blank=True, default="")

    class Meta:
        verbose_name = _("notice")
        verbose_name_plural = _("notices")
        ordering = ["-created_at"]
        indexes = [
            # The scan and the status command walk the pending notices by due time.
            models.Index(fields=["state", "due_at"], name="order_timeout_notice_walk"),
            models.Index(fields=["handler", "key"], name="order_timeout_notice_key"),
        ]

    def __str__(self) -> str:
        return f"{self.handler} {self.key} ({self.state})"


class QueueEpoch(models.Model):
    """That a queue in Redis was set up, kept where Redis cannot lose it.

    Each shard of the queue holds a marker with the same epoch. A consumer that finds a marker
    gone while this row exists knows Redis lost the queue (a restart without persistence, a
    FLUSHDB, a failover to an empty replica), and rebuilds it from the rows at once
    (``scans/recovery.py``). With no row, the queue is new: the markers are set, nothing rebuilt.
    """

    # The queue's key prefix and kind: what its shards' keys start with.
    queue = models.CharField(_("queue"), max_length=200, unique=True)
    epoch = models.CharField(_("epoch"), max_length=32)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    # When a consumer last rebuilt the queue from the rows, after Redis lost it.
    rebuilt_at = models.DateTimeField(_("rebuilt at"), null=True, blank=True)
    rebuilds = models.PositiveIntegerField(_("rebuilds"), default=0)

    class Meta:
        verbose_name = _("queue epoch")
        verbose_name_plural = _("queue epochs")

    def __str__(self) -> str:
        return f"{self.queue}: {self.epoch}"


class Pause(models.Model):
    """A timer paused by staff (a payment provider down), and its resume, kept where Redis cannot
    lose them.

    Open (``resumed_at`` empty) while the timer is paused: no consumer claims its members and no
    scan acts on its rows; they wait in Redis, and a payment is accepted as ever. One open pause per
    timer (``open_for`` is unique: the timer's name while open, empty once resumed). Kept once
    resumed: who paused what, when and why, who resumed it and what was given back.
    """

    # The paused kind by its name: "close", "reminders", "notices", or a declared timer's name.
    timer = models.CharField(_("timer"), max_length=64)
    # The timer's name while the pause is open, NULL once it is resumed: a unique column where
    # MariaDB and MySQL have no partial unique index (many NULLs are allowed, one open pause each).
    open_for = models.CharField(_("open for"), max_length=64, null=True, blank=True, unique=True, editable=False)
    reason = models.TextField(_("reason"))
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)
    paused_by = models.ForeignKey(django_settings.AUTH_USER_MODEL, verbose_name=_("paused by"), null=True,
                                  blank=True, on_delete=models.SET_NULL, related_name="+")
    resumed_at = models.DateTimeField(_("resumed at"), null=True, blank=True)
    resumed_by = models.ForeignKey(django_settings.AUTH_USER_MODEL, verbose_name=_("resumed by"), null=True,
                                   blank=True, on_delete=models.SET_NULL, related_name="+")
    # The time given back to the rows whose deadline fell inside the pause (or just after it):
    # how much each deadline moved, how many rows, and the last key moved (a give-back cut short
    # goes on from there, so no row moves twice).
    given_back_seconds = models.FloatField(_("seconds given back"), null=True, blank=True)
    given_back_rows = models.PositiveIntegerField(_("rows given back"), default=0)
    give_back_after = models.CharField(_("given back up to"), max_length=64, blank=True, default="",
                                       editable=False)

    class Meta:
        verbose_name = _("pause")
        verbose_name_plural = _("pauses")
        ordering = ["-paused_at"]
        permissions = [("pause_timers", _("Can pause and resume timers"))]

    def __str__(self) -> str:
        return f"{self.timer} paused at {self.paused_at}"

    @property
    def is_open(self) -> bool:
        return self.resumed_at is None


class RefusedWriteQuerySet(models.QuerySet["RefusedWrite"]):
    def open(self) -> RefusedWriteQuerySet:
        """Not handled yet: what waits for staff (along the ``handled_at`` index)."""
        return self.filter(handled_at__isnull=True)

    def mark_handled(self, by: Any, at: datetime, note: str = "") -> int:
        """Mark the open ones among these handled by ``by`` (a user, or None) at ``at``, with ``note``
        (what was done: a refund's reference); how many. Conditional on still open, so two staff
        marking the same row at once mark it once."""
        return self.open().update(handled_at=at, handled_by=by, handled_note=note[:500])


class RefusedWrite(models.Model):
    """A write the app refused to let undo a deadline's act, for staff to act on: a stale copy's
    save over an acted-on row (a timer's ``guard_saves``), or a payment after the deadline closed
    its order (``mark_paid()`` raising ``OrderClosed``). The money may have been taken: a refund,
    or the shop's own way back, is staff's to decide. Written apart from the refused transaction,
    which the refusal rolls back."""

    class Refusal(models.TextChoices):
        STALE_SAVE = "stale_save", _("A stale copy's save over an acted-on row")
        PAID_AFTER_CLOSE = "paid_after_close", _("Paid after its deadline closed it")

    model = models.CharField(_("model"), max_length=100)
    object_id = models.CharField(_("object id"), max_length=64)
    # The row as people and API clients know it (``TIMEOUT_PUBLIC_NAME``, ``Timer.public_name``):
    # the primary key by default. db_default: a 0.3 process still running writes its rows without it.
    public_name = models.CharField(_("name"), max_length=200, blank=True, default="", db_default="")
    # The timer whose act the write would have undone: "close" for the order close.
    timer = models.CharField(_("timer"), max_length=64)
    refusal = models.CharField(_("refusal"), max_length=32, choices=Refusal.choices)
    # What the refused write tried to write (field -> value, as JSON).
    values = models.JSONField(_("values it tried to write"), default=dict, blank=True)
    at = models.DateTimeField(_("at"), default=timezone.now)
    handled_at = models.DateTimeField(_("handled at"), null=True, blank=True)
    handled_by = models.ForeignKey(django_settings.AUTH_USER_MODEL, verbose_name=_("handled by"), null=True,
                                   blank=True, on_delete=models.SET_NULL, related_name="+")
    # What staff did (a refund's reference), from the admin's action or ``order_timeout_refused``.
    handled_note = models.CharField(_("note"), max_length=500, blank=True, default="", db_default="")
    # Set when the row reached what the refused write tried to write by another path (the shop's
    # own late payment): handled by itself at ``handled_at``, with no one in ``handled_by``.
    settled_how = models.CharField(_("settled by itself"), max_length=255, blank=True, default="",
                                   db_default="")

    objects = RefusedWriteQuerySet.as_manager()

    class Meta:
        verbose_name = _("refused write")
        verbose_name_plural = _("refused writes")
        ordering = ["-at"]
        indexes = [
            models.Index(fields=["model", "object_id"], name="order_timeout_refused_row"),
            # The open ones for staff and the status command; the handled ones for the prune.
            models.Index(fields=["handled_at"], name="order_timeout_refused_age"),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.public_name or self.object_id}: {self.get_refusal_display()}"

    @property
    def settled_by_itself(self) -> bool:
        return bool(self.settled_how)

    @property
    def is_handled(self) -> bool:
        return self.handled_at is not None

    @classmethod
    def record(cls, refusal: Refused, values: Mapping[str, Any]) -> None:
        """Keep ``refusal`` for staff, with the ``values`` the refused write tried to write.

        Written apart from the caller's transaction (``db.apart``), which the refusal rolls back.
        Never raises: a refusal that cannot be recorded is still the caller's refusal, and is
        logged instead (one line, ERROR)."""
        row = cls(model=refusal.model_label or "", object_id=str(refusal.pk)[:64], timer=refusal.timer or "",
                  public_name=(refusal.public_name or "")[:200],
                  refusal=cls.Refusal.PAID_AFTER_CLOSE if isinstance(refusal, OrderClosed) else cls.Refusal.STALE_SAVE,
                  values=json_safe(values))
        try:
            insert_apart(row, router.db_for_write(cls))
        except Exception as error:  # noqa: BLE001 - whatever it is, the caller gets its refusal
            logger.error("refused write not recorded (%s %s, timer %s, %s): %s: %s", row.model, row.public_name,
                         row.timer, row.refusal, type(error).__name__, one_line(masked(error)))
            return
        refusal.refused_write_id = row.pk
        logger.warning("refused write #%s recorded for staff: %s %s (pk %s), timer %s, %s", row.pk, row.model,
                       row.public_name, row.object_id, row.timer, row.refusal)


class _LenientEncoder(DjangoJSONEncoder):
    """Django's encoder (datetimes, decimals, UUIDs), and ``str()`` for whatever else a field holds."""

    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return str(o)


def json_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as a JSON column holds them, whatever the fields held: a record never fails on
    a value it cannot encode."""
    return dict(json.loads(json.dumps(dict(values), cls=_LenientEncoder)))
