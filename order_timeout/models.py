"""The order row: the truth about whether an order is unpaid, paid or closed.

Redis only mirrors it. Every state change here is a conditional UPDATE on the
status, so a payment and a timeout racing for the same row are serialised by
the database and exactly one of them wins.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings as django_settings
from django.db import models, router, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .conf import settings
from .exceptions import OrderClosed, StaleOrderStatus

TIMEOUT_REASON = "timeout"


class Status(models.TextChoices):
    UNPAID = "unpaid", _("Unpaid")
    PAID = "paid", _("Paid")
    CLOSED = "closed", _("Closed")


def default_deadline() -> datetime:
    """Now plus ``ORDER_TIMEOUT['DEFAULT_TIMEOUT']`` seconds."""
    return timezone.now() + timedelta(seconds=settings.DEFAULT_TIMEOUT)


class AbstractTimeoutOrder(models.Model):
    """Inherit this in your own Order model and name it in ``ORDER_TIMEOUT['ORDER_MODEL']``."""

    Status = Status

    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.UNPAID
    )
    expires_at = models.DateTimeField(
        _("payment deadline"), default=default_deadline,
        help_text=_("An unpaid order is closed once this moment has passed."),
    )
    closed_at = models.DateTimeField(_("closed at"), null=True, blank=True)
    close_reason = models.CharField(_("close reason"), max_length=32, blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    class Meta:
        abstract = True
        # The compensation scan and the admin's "overdue" view walk this index.
        indexes = [models.Index(fields=["status", "expires_at"])]

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any) -> Any:
        instance = super().from_db(db, field_names, values)
        instance._remember_queue_state()
        return instance

    def _remember_queue_state(self) -> None:
        """What the queue last saw of this row, so an unrelated save leaves Redis alone."""
        self._queue_state = (self.__dict__.get("status"), self.__dict__.get("expires_at"))

    def queue_state_changed(self) -> bool:
        return getattr(self, "_queue_state", None) != (self.status, self.expires_at)

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save, refusing to write over a row that was paid or closed since this object was loaded.

        Paid and closed are final: a stale copy saved as unpaid would put a
        closed order back on the queue (closed twice) or a paid one (closed
        after payment). The check locks the row, so it cannot race the consumer.
        """
        update_fields = kwargs.get("update_fields")
        writes_status = update_fields is None or "status" in update_fields
        if self._state.adding or self.pk is None or not writes_status:
            super().save(*args, **kwargs)
            return
        using = kwargs.get("using") or self._state.db or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using):
            current = (type(self)._default_manager.db_manager(using).select_for_update()
                       .filter(pk=self.pk).values_list("status", flat=True).first())
            if current not in (None, Status.UNPAID, self.status):
                raise StaleOrderStatus(
                    f"{type(self).__name__} {self.pk!r} is {current} in the database; "
                    f"refusing to save it as {self.status}."
                )
            super().save(*args, **kwargs)

    def _conditional_update(self, **values: Any) -> bool:
        """UPDATE this row only while it is unpaid; True if it was."""
        using = self._state.db or router.db_for_write(type(self), instance=self)
        manager = type(self)._default_manager.db_manager(using)
        updated = manager.filter(pk=self.pk, status=Status.UNPAID).update(**values)
        if updated:
            for name, value in values.items():
                setattr(self, name, value)
            self._remember_queue_state()
            return True
        current = manager.filter(pk=self.pk).values_list("status", flat=True).first()
        if current is None:
            raise type(self).DoesNotExist(f"{type(self).__name__} {self.pk!r} does not exist.")
        self.status = current
        if current == Status.CLOSED:
            raise OrderClosed(f"{type(self).__name__} {self.pk!r} was already closed.")
        return False

    def mark_paid(self, **fields: Any) -> bool:
        """Mark the order paid (with any extra ``fields``) and take it off the queue.

        Returns True when this call paid it and False when it was already paid
        (payment callbacks get retried). Raises ``OrderClosed`` when the
        deadline closed it first: the payment must then be refunded.
        """
        from .scheduling import unschedule

        paid = self._conditional_update(status=Status.PAID, **fields)
        if paid:
            unschedule([self])
        return paid

    def extend_deadline(self, until: datetime) -> bool:
        """Move the deadline of an unpaid order to ``until`` and reschedule it.

        Returns False when the order is already paid; raises ``OrderClosed``
        when it was closed first.
        """
        from .scheduling import schedule

        if timezone.is_naive(until):
            raise ValueError("extend_deadline() needs an aware datetime.")
        extended = self._conditional_update(expires_at=until)
        if extended:
            schedule([self])
        return extended


class Order(AbstractTimeoutOrder):
    """The ready-made order model, for shops that have none of their own yet."""

    class Meta(AbstractTimeoutOrder.Meta):
        verbose_name = _("order")
        verbose_name_plural = _("orders")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Order {self.pk} ({self.status})"


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

    order_model = models.CharField(_("order model"), max_length=100)
    order_id = models.CharField(_("order id"), max_length=64)
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
        indexes = [models.Index(fields=["order_model", "order_id"])]
        permissions = [
            ("requeue_deadletter", _("Can requeue a dead letter")),
            ("close_deadletter_order", _("Can close a dead letter's order now")),
        ]

    def __str__(self) -> str:
        return f"{self.order_model} {self.order_id} ({self.attempts} attempts)"

    @property
    def is_resolved(self) -> bool:
        return self.resolved_at is not None
