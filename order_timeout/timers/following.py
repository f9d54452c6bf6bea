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

Every save either guard refuses is kept for staff (``RefusedWrite``, with what it tried to
write): the shop's own code may have committed something the row no longer agrees with (a
payment's row, captured money) before its save of the row was refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import router
from django.db.models import Q
from django.db.models.signals import post_delete, post_init, post_save, pre_save

from ..exceptions import OrderClosed, StaleOrderStatus
from ..models import RefusedWrite
from .kind import NOW
from .syncing import follow, forget

if TYPE_CHECKING:
    from .kind import Kind

# Where an instance keeps, per timer, the deadline it was loaded with.
SEEN = "_order_timeout_seen"
# The timers that guard saves, by model: what a refresh notes again (``_note_again_on_refresh``).
_GUARDING: dict[Any, list[Kind]] = {}


def follow_model(timer: Kind) -> None:
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
    if timer.guard_saves:
        post_init.connect(_noting_acted(timer), sender=model, weak=False, dispatch_uid=f"{uid}.acted")
        pre_save.connect(_guarding(timer), sender=model, weak=False, dispatch_uid=f"{uid}.guard")
        post_save.connect(_noting_acted(timer), sender=model, weak=False, dispatch_uid=f"{uid}.saved-acted")
        _GUARDING.setdefault(model, []).append(timer)
        _note_again_on_refresh(model)


def unfollow_model(timer: Kind) -> None:
    uid = f"order_timeout.timer.{timer.name}"
    guarding = _GUARDING.get(timer.model, [])
    if timer in guarding:
        guarding.remove(timer)
    for signal, part in ((post_init, "init"), (post_save, "saved"), (post_delete, "deleted"), (pre_save, "final"),
                         (post_init, "acted"), (pre_save, "guard"), (post_save, "saved-acted")):
        signal.disconnect(sender=timer.model, dispatch_uid=f"{uid}.{part}")


def _noting(timer: Kind) -> Any:
    field = timer.deadline

    def noted(sender: Any, instance: Any, **kwargs: Any) -> None:
        instance.__dict__.setdefault(SEEN, {})[timer.name] = instance.__dict__.get(field)

    return noted


def _saved(timer: Kind) -> Any:
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


def _noting_waits(timer: Kind) -> Any:
    follows = [_attname(timer.model, name) for name in timer.deadline_follows]

    def noted(sender: Any, instance: Any, **kwargs: Any) -> None:
        # Unknown (None) for a row loaded with deferred fields: waits() might read one (a query).
        waited = None if instance.get_deferred_fields() else timer.waits(instance)
        seen = instance.__dict__.setdefault(SEEN, {})
        seen[timer.name] = waited
        if follows:
            seen[f"{timer.name}:follows"] = [instance.__dict__.get(name) for name in follows]

    return noted


def _saved_outside(timer: Kind) -> Any:
    from .deadlines import OutsideDeadlines

    store = timer.deadlines
    assert isinstance(store, OutsideDeadlines)

    follows = [_attname(timer.model, name) for name in timer.deadline_follows]

    def saved(sender: Any, instance: Any, raw: bool = False, created: bool = False, **kwargs: Any) -> None:
        if raw:
            return
        seen = instance.__dict__.setdefault(SEEN, {})
        waited = False if created else seen.get(timer.name)
        waits = timer.waits(instance)
        seen[timer.name] = waits
        followed = [instance.__dict__.get(name) for name in follows]
        moved = bool(follows) and seen.get(f"{timer.name}:follows") != followed
        seen[f"{timer.name}:follows"] = followed
        if waits and (waited is not True or moved):
            if waited is None and not moved and store.of(instance) is not None:
                return  # waiting already, with its deadline
            at = timer.deadline_for(instance)
            if at is not None:
                store.put(instance, at)
            elif waited is True:
                store.drop(instance)  # the field it follows no longer gives a deadline
        elif not waits and waited is not False:
            store.drop(instance)

    return saved


def _deleted_outside(timer: Kind) -> Any:
    from .deadlines import OutsideDeadlines

    store = timer.deadlines
    assert isinstance(store, OutsideDeadlines)

    def deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
        store.drop(instance)

    return deleted


def _deleted(timer: Kind) -> Any:
    def deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
        forget([timer], [instance])

    return deleted


def _attname(model: Any, name: str) -> str:
    """Where a loaded instance keeps a field's value (``customer_id`` for ``customer``)."""
    return str(getattr(model._meta.get_field(name), "attname", name))


def _act_written(timer: Kind) -> dict[str, Any]:
    """What the act writes that a row can be compared with (``values`` but ``NOW``), by attname."""
    return {_attname(timer.model, name): value for name, value in timer.values.items() if value is not NOW}


def _acted(written: dict[str, Any], instance: Any) -> bool | None:
    """Whether the instance in hand holds what the act writes (None: a field of it is deferred)."""
    loaded = instance.__dict__
    if any(name not in loaded for name in written):
        return None
    return all(loaded[name] == value for name, value in written.items())


def _noting_acted(timer: Kind) -> Any:
    """post_init, post_save (and a refresh): whether the row in hand was acted on when it was read."""
    written = _act_written(timer)

    def noted(sender: Any, instance: Any, **kwargs: Any) -> None:
        instance.__dict__.pop(UPDATE_HOOK, None)  # after a save: its hook was for that save only
        if not kwargs.get("raw"):
            instance.__dict__.setdefault(SEEN, {})[f"{timer.name}:acted"] = _acted(written, instance)

    return noted


def _note_again_on_refresh(model: Any) -> None:
    """``refresh_from_db()`` reads the row again into the same instance (no post_init of its own):
    what the guarded timers noted is noted again, so a shop that re-reads after a refusal takes
    its own path for an acted-on row. Wrapped once per model."""
    original = model.refresh_from_db
    if getattr(original, "_order_timeout_notes", False):
        return

    def refresh_from_db(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for timer in _GUARDING.get(type(self), ()):
            _noting_acted(timer)(type(self), self)

    refresh_from_db._order_timeout_notes = True  # type: ignore[attr-defined]
    refresh_from_db.__doc__ = original.__doc__
    model.refresh_from_db = refresh_from_db


# The name Django's save calls for the UPDATE of an existing row (``Model._do_update(base_qs, ...)``,
# the same first argument in Django 5.2 and 6.x): set on the instance for one save, it makes that
# UPDATE conditional on the row not acted on.
UPDATE_HOOK = "_do_update"


def _guarding(timer: Kind) -> Any:
    """pre_save: a save of a row read before the act, writing what the act wrote, is conditional
    on the row still not acted on: ``... WHERE pk = %s AND NOT (<what the act writes>)``. One
    statement, so no lock is needed for it, in a transaction or not; when it matches no row that
    exists, the act came first and the save is refused."""
    written = _act_written(timer)
    fields = {timer.model._meta.get_field(name).name for name in timer.values if timer.values[name] is not NOW}
    unacted = ~Q(**{name: value for name, value in timer.values.items() if value is not NOW})
    # Every field the act writes (its NOW ones too), by name: what a refused save is recorded with.
    acted_fields = [timer.model._meta.get_field(name) for name in timer.values]

    def guard(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
        instance.__dict__.pop(UPDATE_HOOK, None)
        if raw or instance._state.adding or instance.pk is None:
            return
        if update_fields is not None and not fields & set(update_fields):
            return  # writes nothing the act wrote
        if instance.__dict__.get(SEEN, {}).get(f"{timer.name}:acted") is not False \
                or _acted(written, instance):
            return  # read after the act (the shop's own path), unknown, or writing what the act writes

        def update(base_qs: Any, *args: Any, **kwargs: Any) -> Any:
            instance.__dict__.pop(UPDATE_HOOK, None)
            updated = type(instance)._do_update(instance, base_qs.filter(unacted), *args, **kwargs)
            if not updated and base_qs.filter(pk=instance.pk).exists():
                public_name = timer.public_name(instance)
                refusal = StaleOrderStatus(
                    f"{sender.__name__} {public_name} was acted on by its timer {timer.name!r} "
                    f"({', '.join(f'{name}={value!r}' for name, value in written.items())}) after this copy "
                    "was read; refusing to write over it. Read the row again: an acted-on row takes the "
                    "shop's own path (a late payment, a reopening).",
                    model_label=sender._meta.label, pk=instance.pk, timer=timer.name, public_name=public_name)
                RefusedWrite.record(refusal, _tried(instance, acted_fields, update_fields))
                raise refusal
            return updated

        instance.__dict__[UPDATE_HOOK] = update

    return guard


def _guard(timer: Kind) -> Any:
    """pre_save: refuse to move a row the timer acted on away from what its act wrote."""
    written = {name: value for name, value in timer.values.items() if value is not NOW}
    acted_fields = [timer.model._meta.get_field(name) for name in timer.values]

    def guard(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
        if raw or instance._state.adding or instance.pk is None or not written:
            return
        fields = [name for name in written if update_fields is None or name in update_fields]
        if not fields or all(getattr(instance, name) == written[name] for name in fields):
            return
        using = kwargs.get("using") or router.db_for_write(sender, instance=instance)
        current = sender._base_manager.db_manager(using).filter(pk=instance.pk).values(*written).first()
        if current is not None and current == written:
            public_name = timer.public_name(instance)
            refusal = OrderClosed(
                f"{str(sender._meta.verbose_name).capitalize()} {public_name} was acted on at its deadline (its "
                f"timer {timer.name!r} wrote {', '.join(f'{name} {value!r}' for name, value in written.items())}) "
                "and can no longer be moved away from that.",
                model_label=sender._meta.label, pk=instance.pk, timer=timer.name, public_name=public_name)
            RefusedWrite.record(refusal, _tried(instance, acted_fields, update_fields))
            raise refusal

    return guard


def _tried(instance: Any, fields: list[Any], update_fields: Any) -> dict[str, Any]:
    """What a refused save would have written over the act: the fields the act writes that the
    save writes too (every field, or those ``update_fields`` names), as this copy holds them."""
    return {field.attname: getattr(instance, field.attname) for field in fields
            if update_fields is None or field.name in update_fields or field.attname in update_fields}
