"""Redis follows a declared timer's rows, and an acted-on row stays acted on: from outside the model.

For a timer whose deadline is a column, the app listens to the model's own
signals (no edit of the model): a save that changed the deadline schedules
the row after commit, a delete forgets it. What the row held when it was
loaded is noted as it is built (``post_init``), so a save that changes
nothing leaves Redis alone (a retry in backoff keeps its time). A timer
whose deadlines live in the app's table is told by ``set_deadline()``, or,
when it declares ``deadline_for``, by the saves themselves: a row saved into
``waits`` (created so, or moved there: a draft completed, a fixture's default
status rewritten) gets its deadline; a row saved out of it (confirmed, paid)
loses it. What ``waits`` said when the row was loaded is noted as it is
built, from the loaded fields only (a row loaded with deferred fields is
looked up instead), so an ordinary save costs no query.

A ``final`` timer refuses, on the model's save path (``pre_save``), a save
that moves a row it acted on away from what its act wrote: the move to paid
after a close raises ``OrderClosed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import router
from django.db.models.signals import post_delete, post_init, post_save, pre_save

from ..exceptions import OrderClosed
from ..scheduling import follow, forget
from .kind import NOW

if TYPE_CHECKING:
    from .kind import Timer

# Where an instance keeps, per timer, the deadline it was loaded with.
SEEN = "_order_timeout_seen"


def follow_model(timer: Timer) -> None:
    uid = f"order_timeout.timer.{timer.name}"
    model = timer.model
    if timer.deadline is not None:
        post_init.connect(_noting(timer), sender=model, weak=False, dispatch_uid=f"{uid}.init")
        post_save.connect(_saved(timer), sender=model, weak=False, dispatch_uid=f"{uid}.saved")
        post_delete.connect(_deleted(timer), sender=model, weak=False, dispatch_uid=f"{uid}.deleted")
    else:
        if timer.follows_saves:
            post_init.connect(_noting_waits(timer), sender=model, weak=False, dispatch_uid=f"{uid}.init")
            post_save.connect(_saved_outside(timer), sender=model, weak=False, dispatch_uid=f"{uid}.saved")
        # A deleted row's deadline goes with it (the app's table has no foreign key to the row).
        post_delete.connect(_deleted_outside(timer), sender=model, weak=False, dispatch_uid=f"{uid}.deleted")
    if timer.final:
        pre_save.connect(_guard(timer), sender=model, weak=False, dispatch_uid=f"{uid}.final")


def unfollow_model(timer: Timer) -> None:
    uid = f"order_timeout.timer.{timer.name}"
    for signal, part in ((post_init, "init"), (post_save, "saved"), (post_delete, "deleted"), (pre_save, "final")):
        signal.disconnect(sender=timer.model, dispatch_uid=f"{uid}.{part}")


def _noting(timer: Timer) -> Any:
    field = timer.deadline

    def noted(sender: Any, instance: Any, **kwargs: Any) -> None:
        instance.__dict__.setdefault(SEEN, {})[timer.name] = instance.__dict__.get(field)

    return noted


def _saved(timer: Timer) -> Any:
    field = timer.deadline
    assert field is not None  # a column: only such timers follow saves

    def saved(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, created: bool = False,
              **kwargs: Any) -> None:
        if raw or (update_fields is not None and field not in update_fields):
            return
        seen = instance.__dict__.setdefault(SEEN, {})
        if not created and timer.name in seen and seen[timer.name] == getattr(instance, field):
            return
        seen[timer.name] = getattr(instance, field)
        follow([timer], [instance])

    return saved


def _noting_waits(timer: Timer) -> Any:
    def noted(sender: Any, instance: Any, **kwargs: Any) -> None:
        # Unknown (None) for a row loaded with deferred fields: waits() might read one (a query).
        waited = None if instance.get_deferred_fields() else timer.waits(instance)
        instance.__dict__.setdefault(SEEN, {})[timer.name] = waited

    return noted


def _saved_outside(timer: Timer) -> Any:
    from .deadlines import OutsideDeadlines

    store = timer.deadlines
    assert isinstance(store, OutsideDeadlines)

    def saved(sender: Any, instance: Any, raw: bool = False, created: bool = False, **kwargs: Any) -> None:
        if raw:
            return
        seen = instance.__dict__.setdefault(SEEN, {})
        waited = False if created else seen.get(timer.name)
        waits = timer.waits(instance)
        seen[timer.name] = waits
        if waits and waited is not True:
            if waited is None and store.of(instance) is not None:
                return  # waiting already, with its deadline
            at = timer.deadline_for(instance)
            if at is not None:
                store.put(instance, at)
        elif not waits and waited is not False:
            store.drop(instance)

    return saved


def _deleted_outside(timer: Timer) -> Any:
    from .deadlines import OutsideDeadlines

    store = timer.deadlines
    assert isinstance(store, OutsideDeadlines)

    def deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
        store.drop(instance)

    return deleted


def _deleted(timer: Timer) -> Any:
    def deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
        forget([timer], [instance])

    return deleted


def _guard(timer: Timer) -> Any:
    """pre_save: refuse to move a row the timer acted on away from what its act wrote."""
    written = {name: value for name, value in timer.values.items() if value is not NOW}

    def guard(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
        if raw or instance._state.adding or instance.pk is None or not written:
            return
        fields = [name for name in written if update_fields is None or name in update_fields]
        if not fields or all(getattr(instance, name) == written[name] for name in fields):
            return
        using = kwargs.get("using") or router.db_for_write(sender, instance=instance)
        current = sender._base_manager.db_manager(using).filter(pk=instance.pk).values(*written).first()
        if current is not None and current == written:
            raise OrderClosed(
                f"{sender.__name__} {instance.pk!r} was acted on by its timer {timer.name!r} "
                f"({', '.join(f'{name}={value!r}' for name, value in written.items())}); "
                "refusing to move it away from that.")

    return guard
