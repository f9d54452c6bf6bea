"""The handlers a shop declares: what delivers a notice to the outside world, by name.

Declared like timers, in a ``notices.py`` (or ``timers.py``) of one of the
shop's apps, which the app imports when Django starts::

    from order_timeout import notices

    @notices.handler("order-expired-email", timeout=10)
    def order_expired_email(delivery):
        ...  # raise to retry; notices.Rejected(...) to give up at once

A name is what a notice row records (``Notice.handler``), so a name stays once
notices carry it; ``notify()`` refuses a name no handler is declared for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model, Q

# A handler's name goes into every notice row (and so into dead letters and logs).
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
# Seconds a handler may take by default: the ready handlers pass it to their client.
DEFAULT_TIMEOUT = 10.0

Send = Callable[[Any], None]


class AlreadyDeclared(ImproperlyConfigured):
    pass


@dataclass(frozen=True)
class Handler:
    """One declared handler: its name, the callable, its timeout, and (for a notice due later) what
    its object must still meet when it is due ("re-send the SMS unless it was confirmed")."""

    name: str
    send: Send
    timeout: float = DEFAULT_TIMEOUT
    # With ``pending``: the model of the objects its notices are about, and the condition each
    # must still meet, asked when the notice is due; a notice whose object no longer meets it is
    # dropped, not delivered.
    model: type[Model] | None = None
    pending: Q | None = None


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def handler(self, name: str, *, timeout: float = DEFAULT_TIMEOUT, model: type[Model] | None = None,
                pending: Q | None = None) -> Callable[[Send], Send]:
        """Declare the decorated callable as the handler named ``name``."""

        def declare(send: Send) -> Send:
            self.declare(name, send, timeout=timeout, model=model, pending=pending)
            return send

        return declare

    def declare(self, name: str, send: Send, *, timeout: float = DEFAULT_TIMEOUT,
                model: type[Model] | None = None, pending: Q | None = None) -> Handler:
        where = getattr(send, "__qualname__", repr(send))
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ImproperlyConfigured(f"notice handler {where}: its name must be 1 to 100 letters, digits and "
                                       f"_ . : -, got {name!r}.")
        if not callable(send):
            raise ImproperlyConfigured(f"notice handler {name!r}: {send!r} is not callable.")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
            raise ImproperlyConfigured(f"notice handler {name!r}: timeout must be seconds, more than 0 and at "
                                       f"most 3600, got {timeout!r}.")
        if (pending is None) != (model is None):
            raise ImproperlyConfigured(f"notice handler {name!r}: pending and model go together (the condition "
                                       "its notices' objects must still meet, and their model).")
        if pending is not None and not isinstance(pending, Q):
            raise ImproperlyConfigured(f"notice handler {name!r}: pending must be a Q over {model!r}, "
                                       f"got {pending!r}.")
        if name in self._handlers:
            raise AlreadyDeclared(f"A notice handler named {name!r} is declared already "
                                  f"({self._handlers[name].send!r}); give this one another name.")
        handler = Handler(name=name, send=send, timeout=float(timeout), model=model, pending=pending)
        self._handlers[name] = handler
        return handler

    def forget(self, name: str) -> None:
        """Undo ``declare`` (tests)."""
        self._handlers.pop(name, None)

    def get(self, name: str) -> Handler:
        try:
            return self._handlers[name]
        except KeyError:
            known = ", ".join(map(repr, self._handlers)) or "none"
            raise LookupError(f"no notice handler named {name!r} is declared (declared: {known})") from None

    @contextmanager
    def sending_to(self, send: Send) -> Iterator[None]:
        """Every declared handler sends through ``send`` for a while, its name, timeout and
        condition kept: a test's local outbox (order_timeout.testing), as Django's locmem e-mail
        backend stands in for the mail server."""
        declared = dict(self._handlers)
        self._handlers = {name: replace(handler, send=send) for name, handler in declared.items()}
        try:
            yield
        finally:
            # Those declared meanwhile stay as they were declared.
            self._handlers = {**{name: handler for name, handler in self._handlers.items() if name not in declared},
                              **declared}

    def names(self) -> list[str]:
        return list(self._handlers)

    def __bool__(self) -> bool:
        return bool(self._handlers)


handlers = HandlerRegistry()
handler = handlers.handler
