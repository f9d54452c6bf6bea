"""The class a shop subclasses says only what docs/timers.md documents; the engine lives elsewhere.

``timers.Timer`` is a declaration, as a ``ModelAdmin`` is: a handful of documented attributes
and hooks, read by an engine (``timers.kind.Declared``). A public name on it that the page does
not list is either an engine step a subclass could shadow by accident, or a promise nobody wrote
down: this test fails on both.
"""

from __future__ import annotations

import re

from order_timeout.timers import Timer, registry
from order_timeout.timers.kind import Declared

from .conftest import PROJECT_ROOT

TIMERS_MD = PROJECT_ROOT / "docs" / "timers.md"


def documented_names() -> set[str]:
    """The names docs/timers.md documents for a shop: its table of attributes (a row each, the
    name in backquotes, a method with its arguments) and the methods a shop calls (a bullet
    each)."""
    text = TIMERS_MD.read_text()
    table = text[text.index("## The attributes"):text.index("### What the act does")]
    rows = re.findall(r"^\| `(\w+)(?:\([^`]*\))?` \|", table, re.MULTILINE)
    bullets = re.findall(r"^- (.*?):", table, re.MULTILINE)
    calls = {name for bullet in bullets for name in re.findall(r"`(\w+)\([^`]*\)`", bullet)}
    return set(rows) | calls


def public_names(cls: type) -> set[str]:
    """What a subclass sees: attributes and methods, and the names only annotated (``model``)."""
    annotated = {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}
    return {name for name in {*dir(cls), *annotated} if not name.startswith("_")} - set(dir(object))


def test_the_declaration_has_every_name_the_docs_list_and_no_other():
    documented = documented_names()

    assert documented, "no attribute read from docs/timers.md"
    assert public_names(Timer) == documented


def test_the_docs_reader_sees_the_table_and_the_calls():
    # The test above would pass on a reader that read nothing and a class that had nothing.
    assert {"model", "pending", "values", "fire", "deadline_for", "schedule", "unschedule",
            "set_deadline"} <= documented_names()


def test_a_registered_timer_is_read_by_the_engine_not_made_into_it():
    kind = registry.get("reservation-lapses")

    assert isinstance(kind, Declared) and not isinstance(kind, Timer)
    assert isinstance(kind.declaration, Timer)
    assert (kind.pending, kind.values) == (type(kind.declaration).pending, type(kind.declaration).values)


def test_the_declared_attributes_are_listed_once_and_the_engine_reads_each_from_the_declaration():
    """One list, ``Declarable``: the declaration and the engine's kinds take their defaults from it
    (a plain declared timer and a plain kind cannot drift apart), and a registered timer's kind reads
    every one of them from its declaration, a change to it included."""
    from order_timeout.timers.declaration import ATTRIBUTES, Declarable
    from order_timeout.timers.kind import Declared, Kind

    assert set(ATTRIBUTES) == {"model", "name", "deadline", "pending", "values", "hold", "max_hold", "settled",
                               "final", "guard_saves", "deadline_follows", "yields"}
    assert issubclass(Timer, Declarable) and issubclass(Kind, Declarable)
    assert not any(name in vars(Timer) or name in vars(Kind) for name in ATTRIBUTES)
    assert all(isinstance(vars(Declared)[name], property) for name in ATTRIBUTES)

    kind = registry.get("reservation-lapses")
    declaration = kind.declaration
    assert {name: getattr(kind, name) for name in ATTRIBUTES} == {name: getattr(declaration, name)
                                                                  for name in ATTRIBUTES}
    declaration.yields = True
    try:
        assert kind.yields is True
    finally:
        del declaration.yields
