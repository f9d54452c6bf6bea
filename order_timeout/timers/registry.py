"""Which timers there are: the app's own two kinds, and those a shop declared.

A shop declares its timers from outside its models, as it registers admins::

    @timers.register(StockReservation)
    class ReservationLapses(timers.Timer): ...

in a ``timers.py`` of one of its apps (imported when Django starts, as
``admin.py`` is) or anywhere that runs at start-up. The order close and the
reminders are declared here, the same way, on ``ORDER_MODEL``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import models

from ..conf import settings
from ..notices.writing import queue_written_notices_with
from .closes import OrderTimeout
from .declaration import NOW, Timer
from .kind import Declared, Kind
from .notices import Notices
from .reminders import Reminders

T = TypeVar("T", bound=type[Timer])

# A name goes into Redis keys ({prefix}:<name>:pending) and into dead letters.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
RESERVED = ("", "remind", "notices")

ORDER_TIMEOUT = OrderTimeout()
REMINDERS = Reminders()
NOTICES = Notices()
queue_written_notices_with(NOTICES.queue_written)


class AlreadyRegistered(ImproperlyConfigured):
    pass


class TimerRegistry:
    def __init__(self) -> None:
        self._declared: dict[str, Kind] = {}

    def register(self, model: type[models.Model], timer_class: type[Timer] | None = None) -> Any:
        """Declare ``timer_class`` for ``model``; with no class, a decorator (``@register(Model)``)."""
        if timer_class is None:
            def decorate(cls: T) -> T:
                self.register(model, cls)
                return cls

            return decorate
        timer = _declared(model, timer_class)
        if timer.name in self._declared:
            raise AlreadyRegistered(f"A timer named {timer.name!r} is registered already "
                                    f"({self._declared[timer.name]!r}); give this one another name.")
        self._declared[timer.name] = timer
        from .following import follow_model

        follow_model(timer)
        return timer_class

    def unregister(self, name: str) -> None:
        timer = self._declared.pop(name)
        from .following import unfollow_model

        unfollow_model(timer)

    def declared(self) -> list[Kind]:
        """The timers shops declared, in the order they were."""
        return list(self._declared.values())

    def kinds(self) -> list[Kind]:
        """Every kind a consumer serves: the order close (unless ORDER_MODEL is None), the reminders
        when REMINDERS asks for any, then every declared timer."""
        return [*order_kinds(), *self.reported()]

    def kinds_for(self, model: Any = None, kinds: list[Kind] | None = None) -> list[Kind]:
        """``kinds`` (default ``kinds()``), the order close and its reminders on ``model`` (None:
        ORDER_MODEL)."""
        kinds = self.kinds() if kinds is None else kinds
        if model is None:
            return kinds
        return [OrderTimeout(model) if kind is ORDER_TIMEOUT else Reminders(model) if kind is REMINDERS else kind
                for kind in kinds]

    def reported(self) -> list[Kind]:
        """The kinds reported by name beside the order close: every declared timer, and the notices
        once a handler is declared."""
        from ..notices.registry import handlers

        return [*self._declared.values(), *([NOTICES] if handlers else [])]

    def of_model(self, model: type[models.Model]) -> list[Kind]:
        return [timer for timer in self._declared.values() if timer.model is model]

    def get(self, name: str) -> Kind:
        """The kind named ``name`` ("" is the order close); ``LookupError`` if there is none."""
        if name == ORDER_TIMEOUT.name:
            return ORDER_TIMEOUT
        if name == REMINDERS.name:
            return REMINDERS
        if name == NOTICES.name:
            return NOTICES
        try:
            return self._declared[name]
        except KeyError:
            raise LookupError(f"no timer named {name!r} is registered") from None


def _fields_of(model: type[models.Model], names: Any, attribute: str) -> None:
    """ImproperlyConfigured naming ``attribute`` when one of ``names`` is not a field of ``model``."""
    for field_name in names:
        try:
            model._meta.get_field(field_name)
        except FieldDoesNotExist:
            raise ImproperlyConfigured(f"{attribute} names {field_name!r}, which is not a field of "
                                       f"{model._meta.label}.") from None


def order_kinds() -> list[Kind]:
    """The kinds on the order model: the close, and the reminders if any are asked for; none
    when ORDER_MODEL is None (a project whose only timers are declared ones)."""
    if not settings.closes_orders():
        return []
    return [ORDER_TIMEOUT, *([REMINDERS] if settings.REMINDERS else [])]


def _declared(model: type[models.Model], timer_class: type[Timer]) -> Kind:
    """An instance of ``timer_class`` for ``model``, its declaration checked; ImproperlyConfigured
    naming the class and the attribute otherwise."""
    where = f"{timer_class.__module__}.{timer_class.__qualname__}"
    if not (isinstance(timer_class, type) and issubclass(timer_class, Timer)):
        raise ImproperlyConfigured(f"{where} must subclass order_timeout.timers.Timer.")
    if not (isinstance(model, type) and issubclass(model, models.Model)) or model._meta.abstract:
        raise ImproperlyConfigured(f"{where} is registered for {model!r}, which is not a concrete model.")
    owner = timer_class.__dict__.get("model")
    if owner is not None and owner is not model:
        raise ImproperlyConfigured(f"{where} is registered for {owner._meta.label} already.")
    name = timer_class.name or f"{model._meta.label_lower}.{timer_class.deadline or 'deadline'}"
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in RESERVED:
        raise ImproperlyConfigured(f"{where}.name must be 1 to 64 letters, digits and _ . - (not 'remind'), "
                                   f"got {name!r}.")
    if timer_class.deadline is not None:
        try:
            field = model._meta.get_field(timer_class.deadline)
        except FieldDoesNotExist:
            raise ImproperlyConfigured(f"{where}.deadline is {timer_class.deadline!r}, which is not a field of "
                                       f"{model._meta.label}.") from None
        if not isinstance(field, models.DateTimeField):
            raise ImproperlyConfigured(f"{where}.deadline names {model._meta.label}.{field.name}, which is not a "
                                       "DateTimeField.")
    if not isinstance(timer_class.pending, models.Q) or timer_class.pending == models.Q():
        raise ImproperlyConfigured(f"{where}.pending must be a Q the row still meets when it is to be acted on "
                                   "(what the act changes must make it false, or rows would be acted on again).")
    _fields_of(model, timer_class.values, f"{where}.values")
    if timer_class.guard_saves and not any(value is not NOW for value in timer_class.values.values()):
        raise ImproperlyConfigured(f"{where}.guard_saves needs values the act writes (other than timers.NOW): "
                                   "a save is refused when the row holds them and the copy saved did not.")
    if timer_class.deadline_follows:
        if timer_class.deadline is not None or timer_class.deadline_for is Timer.deadline_for:
            raise ImproperlyConfigured(f"{where}.deadline_follows is for a timer whose deadline is None and that "
                                       "declares deadline_for(): the saves ask it again when these fields change.")
        _fields_of(model, timer_class.deadline_follows, f"{where}.deadline_follows")
    if not timer_class.values and timer_class.fire is Timer.fire:
        raise ImproperlyConfigured(f"{where} declares neither values (an UPDATE) nor fire() (a receiver): "
                                   "it would do nothing at its deadline.")
    timer_class.model = model
    timer_class.name = name
    return Declared(timer_class())


registry = TimerRegistry()
register: Callable[..., Any] = registry.register
