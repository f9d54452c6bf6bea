"""The batch's statements compiled by Django once per shape, each batch's integer keys written in,
and read as the driver's tuples, converted as Django would convert them.

Every batch asks the same statements of the database (the locking ``SELECT``,
a hold's), only its keys differ. Building and compiling one through the ORM
cost 0.3 to 0.7 ms, where a lean batch of 500 closes in about 12. So a
statement is compiled once with a marker key in place of the batch's, and
each batch's keys are written where the marker stood, as ``KeysIn`` writes
them: the statement the ORM would build for those keys, to the byte.

Only for integer keys (they print as their digits), and only when the
marker stands once in the list and, where the statement names the first key
among its parameters (the locking ``SELECT``'s clock, a ``CASE``), once there;
anything else is compiled batch by batch, as before. A shape names what
the statement depends on besides the keys (the model and its manager, the
columns, the condition); a condition that is new each batch (it names the
time) is new each time, and the few shapes last asked are kept. The manager
is the model's base manager, which Django asks never to filter, so the same
shape is the same statement in every thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.db import connections, transaction

from .together import read_together

# The marker key: 2**53 + 1, or the largest a smaller integer key can hold (Django leaves a
# value out of the field's range out of the statement). An int: written as its digits.
MARK = 9_007_199_254_740_993
# Shapes kept (a consumer asks two or three; a condition that changes each batch is a new one).
MOST_SHAPES = 32


@dataclass(frozen=True)
class Compiled:
    """A statement with its batch's keys in, and how its columns are converted."""

    sql: str
    params: tuple[Any, ...]
    # The compiler's converters: {column index: (functions, expression)}.
    converters: dict[int, tuple[list[Any], Any]]
    connection: Any


@dataclass(frozen=True)
class _Template:
    before: str
    after: str
    params: tuple[Any, ...]
    # Where the first key goes among the parameters (None: not there).
    first_key_at: int | None
    converters: dict[int, tuple[list[Any], Any]]


@dataclass(frozen=True)
class Statement:
    """One statement a batch asks: what it depends on besides the keys (``shape``), how to build it
    for some keys (a queryset), and whether it names the first key among its parameters too."""

    shape: Hashable
    build: Callable[[Sequence[Any]], Any]
    names_first_key: bool = False


_templates: OrderedDict[Hashable, _Template | None] = OrderedDict()
_lock = threading.Lock()


def read_in_turn(statements: Sequence[Statement], using: str, pks: Sequence[Any], *,
                 unless_the_first_finds_none: bool = False) -> list[list[tuple[Any, ...]]]:
    """Each statement for ``pks``, compiled (``compiled``) and run in the order given, in the caller's
    transaction; the rows of each, as ``read_rows`` reads them.

    Sent in one round trip where the connection can (``together.read_together``): each still runs
    after the one before it has finished, so a condition read after the locking ``SELECT`` sees
    every commit made before its rows were locked. Otherwise one trip each, and then
    ``unless_the_first_finds_none``: the rest are not run (and read as empty) when the first found
    no row."""
    built = [compiled(statement.shape, using, statement.build, pks, names_first_key=statement.names_first_key)
             for statement in statements]
    # One statement too: on PostgreSQL the transaction's BEGIN goes with it.
    fetched = read_together(built, prepare=timestamps_read_in_c) if built else None
    if fetched is not None:
        return [converted(statement, rows) for statement, rows in zip(built, fetched, strict=True)]
    answers: list[list[tuple[Any, ...]]] = []
    for statement in built:
        if unless_the_first_finds_none and answers and not answers[0]:
            answers.append([])
            continue
        answers.append(read_rows(statement))
    return answers


def compiled(shape: Hashable, using: str, build: Callable[[Sequence[Any]], Any], pks: Sequence[Any], *,
             names_first_key: bool = False) -> Compiled:
    """``build(pks)`` (a queryset on the database ``using``) compiled: from its shape's template
    when the keys are integers. ``names_first_key``: the statement has the first key among its
    parameters too (the locking ``SELECT``'s clock), and its template must have it."""
    if pks and all(type(pk) is int for pk in pks) and _hashable(shape):
        template = _template((using, shape), using, build, 1 if names_first_key else 0)
        if template is not None:
            params = list(template.params)
            if template.first_key_at is not None:
                params[template.first_key_at] = pks[0]
            return Compiled(f"{template.before}{', '.join(map(str, pks))}{template.after}", tuple(params),
                            template.converters, connections[using])
    query = build(pks).query
    with _compiling(using, query):
        compiler = query.get_compiler(using=using)
        sql, params = compiler.as_sql()
    return Compiled(sql, tuple(params), _converters(compiler), compiler.connection)


def _compiling(using: str, query: Any) -> AbstractContextManager[Any]:
    """Where a statement is compiled: Django compiles a locking ``SELECT`` only in a transaction, and a
    two-trip one (two_trips.py) is begun by the query that sends it; so outside one, a locking
    ``SELECT`` is compiled in an ``atomic`` block of its own (a template once per shape; nothing
    is sent in it but the block's own statements)."""
    connection = connections[using]
    if not query.select_for_update or connection.in_atomic_block or not connection.get_autocommit():
        return nullcontext()
    return transaction.atomic(using=using)


def _template(shape: Hashable, using: str, build: Callable[[Sequence[Any]], Any],
              first_keys: int) -> _Template | None:
    with _lock:
        if shape in _templates:
            _templates.move_to_end(shape)
            return _templates[shape]
    queryset = build([0])  # unevaluated: its model, for the marker its key can hold
    mark = _mark(queryset.model, connections[using])
    query = build([mark]).query
    with _compiling(using, query):
        compiler = query.get_compiler(using=using)
        sql, params = compiler.as_sql()
    listed = f"IN ({mark})"
    marks = [at for at, param in enumerate(params) if param == mark]
    template = None
    if sql.count(str(mark)) == 1 and listed in sql and len(marks) == first_keys:
        before, after = sql.split(listed)
        template = _Template(f"{before}IN (", f"){after}", tuple(params), marks[0] if marks else None,
                             _converters(compiler))
    with _lock:
        _templates[shape] = template
        while len(_templates) > MOST_SHAPES:
            _templates.popitem(last=False)
    return template


def _mark(model: Any, connection: Any) -> int:
    """The marker for ``model``'s key: ``MARK``, or the largest its integer field can hold."""
    try:
        _lowest, highest = connection.ops.integer_field_range(model._meta.pk.get_internal_type())
    except KeyError:  # not an integer field: its keys are not ints, and no template is asked for
        return MARK
    return MARK if highest is None else min(MARK, highest)


def _hashable(shape: Hashable) -> bool:
    """A condition may hold a value with no hash (then it is compiled batch by batch)."""
    try:
        hash(shape)
    except TypeError:
        return False
    return True


def _converters(compiler: Any) -> dict[int, tuple[list[Any], Any]]:
    return dict(compiler.get_converters([column for column, _sql, _alias in compiler.select]))



def read_rows(statement: Compiled) -> list[tuple[Any, ...]]:
    """The statement's rows, each the driver's tuple, converted as Django would convert them.

    Read through the cursor, not a queryset's iterator: that converts each row in Python,
    value by value (on MySQL a ``make_aware`` per DATETIME, two a row), where here a column that
    needs converting is converted whole, and most need nothing (an integer key, a status).
    """
    with statement.connection.cursor() as cursor:
        timestamps_read_in_c(cursor)
        cursor.execute(statement.sql, statement.params)
        fetched = cursor.fetchall()
    return converted(statement, fetched)


def converted(statement: Compiled, fetched: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The driver's rows of ``statement``, each column converted as Django would convert it."""
    if fetched and statement.converters:
        columns = list(zip(*fetched, strict=True))
        for at, (functions, expression) in statement.converters.items():
            columns[at] = _converted(columns[at], functions, expression, statement.connection)
        fetched = list(zip(*columns, strict=True))
    return list(fetched)


def timestamps_read_in_c(cursor: Any) -> None:
    """On PostgreSQL (psycopg 3), this cursor reads a ``timestamptz`` with psycopg's own loader.

    Django's is a subclass of it in Python (to hand back its own time zone object), so psycopg
    never swaps in its C twin: 3 us a value, a deadline a row. psycopg's own reads the instant
    in the session's time zone, which Django set to the connection's: the same instant, aware
    either way. Not without ``USE_TZ``: there Django's loader drops the zone.
    """
    adapters = getattr(getattr(cursor, "cursor", None), "adapters", None)
    if adapters is None or not django_settings.USE_TZ:
        return  # MySQL, psycopg2
    from psycopg.types.datetime import TimestamptzLoader

    adapters.register_loader("timestamptz", TimestamptzLoader)


def _converted(values: Sequence[Any], functions: list[Any], expression: Any, connection: Any) -> tuple[Any, ...]:
    """A column's values as Django's converters make them, the common one without a call a value."""
    mysql_datetime = getattr(type(connection.ops), "convert_datetimefield_value", None)
    if (connection.vendor == "mysql" and len(functions) == 1
            and getattr(functions[0], "__func__", None) is mysql_datetime):
        # MySQL's converter is make_aware() in the connection's time zone: a naive DATETIME
        # given its zone, which is what replace() does with a zoneinfo zone.
        zone = connection.timezone
        return tuple([None if value is None else value.replace(tzinfo=zone) for value in values])
    converted = []
    for value in values:
        for function in functions:
            value = function(value, expression, connection)
        converted.append(value)
    return tuple(converted)
