"""The log lines docs/operations.md tells an operator to alert on: every one the app can write at
WARNING or above is listed, and every one listed is written, in a real run where it can be.

The page's table ("Log lines to alert on") is read row by row, each line as it
is documented (``…`` for what varies). Two checks hold it to the code:

- The source, read with ``ast``: every logging call at WARNING or above in the
  app's modules (``warning``, ``error``, ``exception``, ``critical``, and ``log``
  at such a level) must have a row at its level whose line its format string
  can write (each placeholder standing for anything on one line: a row may say
  more of what a placeholder writes, ``close`` for ``%s``, never less). And
  every row at WARNING or above must be written by such a call. A new call
  without its row, or a row whose call changed or went, fails at once, with
  no server.
- A real run: every row must match a record the ``order_timeout`` logger wrote,
  at the row's level, while the scenarios below produce each fault against the
  real servers: receivers and a target that raise, Redis lost and stopped, the
  database gone, a consumer dead or stuck, members that name no order, a
  database not migrated yet, a policy that answers no deadline, a pause. A line
  an operator matches on is one line: only the give-up ("the last error
  follows") carries its traceback.

A row no scenario can produce cheaply is named in ``PROVEN_BY_THE_SOURCE``, with
the reason: Redis or the database lost between two steps of one scan, a bug's
line (which carries its traceback), a grant the test servers have. For those
the first check alone proves the row, so a row can still never outlive its
line; every other row, old or new, must be produced by the run.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection, connections
from django.db.migrations.recorder import MigrationRecorder
from django.dispatch import Signal
from django.utils import timezone

from order_timeout import models, notify, unschedule
from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.db.session import session_identity
from order_timeout.exceptions import OrderClosed
from order_timeout.notices import handlers
from order_timeout.ordermodel import get_order_model
from order_timeout.queue import TimeoutQueue
from order_timeout.reporting.metrics import BacklogCollector
from order_timeout.scans import housekeeper, refusals, turns
from order_timeout.scans.compensation import compensate
from order_timeout.scans.housekeeper import Housekeeper
from order_timeout.scans.pruning import prune
from order_timeout.scans.redate import Redate
from order_timeout.scans.turns import PRUNE, run_prune, run_scan, take_turn
from order_timeout.signals import order_expired
from order_timeout.tasks import compensate as compensate_task
from order_timeout.timers.heartbeats import Heartbeat
from order_timeout.timers.leases import LeaseGuard
from order_timeout.timers.members import now_score
from order_timeout.timers.pausing import known_names, pause, resume
from order_timeout.timers.registry import NOTICES, ORDER_TIMEOUT, REMINDERS
from order_timeout.timers.watchdog import EXIT_STUCK

from .conftest import PROJECT_ROOT, Clock, PrivateRedis, database_url, running, time_left, wait_for
from .helpers import claim_everywhere, keys_for, lose_redis_data, state
from .holding import HeldReceiver
from .kinds import Case, CloseCase, ReminderCase, ReservationCase
from .test_consumer import OutageRightAfterTheClaim
from .test_retries_and_dead_letters import broken_dead_letter_table

OPERATIONS = PROJECT_ROOT / "docs" / "operations.md"
SECTION = "### Log lines to alert on"
# What a documented line writes for the parts that vary from one record to the next.
VARIES = "…"
# What a line says when its traceback follows it: the give-up's, the one line that carries one.
WITH_TRACEBACK = "the last error follows"


# -- the page's table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Documented:
    """One row of the table: a line as the page shows it, at its level."""

    level: int
    line: str

    @property
    def pattern(self) -> re.Pattern[str]:
        """The line with each ``…`` matching anything on one line (never a line break)."""
        return re.compile(".*?".join(re.escape(part) for part in self.line.split(VARIES)))

    @property
    def literal(self) -> int:
        """How much of the line is fixed text: a record both a general and a specific row match
        (``… failed …`` and ``close failed …``) counts for the specific one."""
        return len(self.line.replace(VARIES, ""))

    @property
    def with_traceback(self) -> bool:
        """Whether its records carry a traceback: the give-up's do, and no other line's."""
        return WITH_TRACEBACK in self.line

    def matches(self, record: logging.LogRecord) -> bool:
        """The record's level is the row's, and its whole message is the line."""
        return record.levelno == self.level and self.pattern.fullmatch(record.getMessage()) is not None


def cells(row: str) -> list[str]:
    """A Markdown table row's cells (a ``\\|`` inside a cell is a pipe, not a border)."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def documented_lines(text: str | None = None) -> list[Documented]:
    """Every row of the section's table, read by its ``level`` and ``line`` columns."""
    text = OPERATIONS.read_text(encoding="utf-8") if text is None else text
    assert SECTION in text, f"{OPERATIONS.name} has no {SECTION!r}"
    section = text.split(SECTION + "\n", 1)[1]
    section = re.split(r"^#", section, maxsplit=1, flags=re.MULTILINE)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header, separator, *body = rows
    assert set(cells(separator)) <= {"---", ":---", "---:", ":---:"}, separator
    columns = [name.lower() for name in cells(header)]
    level_at, line_at = columns.index("level"), columns.index("line")
    documented = []
    for row in body:
        values = cells(row)
        assert len(values) == len(columns), f"a row of {len(values)} cells, not {len(columns)}: {row}"
        level = logging.getLevelName(values[level_at].strip("`"))
        assert isinstance(level, int), f"not a level: {values[level_at]!r}"
        quoted = re.fullmatch(r"`([^`]+)`", values[line_at])
        assert quoted, f"the line is not one code span: {values[line_at]!r}"
        documented.append(Documented(level, quoted.group(1)))
    return documented


def credited(documented: list[Documented],
             records: list[logging.LogRecord]) -> dict[Documented, list[logging.LogRecord]]:
    """Each row's records: those it matches and no more specific row does."""
    found: dict[Documented, list[logging.LogRecord]] = {row: [] for row in documented}
    for record in records:
        matching = [row for row in documented if row.matches(record)]
        most = max((row.literal for row in matching), default=0)
        for row in matching:
            if row.literal == most:
                found[row].append(record)
    return found


def assert_each_logged(documented: list[Documented], records: list[logging.LogRecord]) -> None:
    """Every row matched by a record at its level; a traceback with the give-up's records only."""
    found = credited(documented, records)
    never = [f"{logging.getLevelName(row.level)} {row.line}" for row, matched in found.items() if not matched]
    assert not never, "listed on the page, never logged:\n" + "\n".join(never) + "\n\nlogged:\n" + "\n".join(
        f"{record.levelname} {record.getMessage()}" for record in records)
    wrong = [f"{row.line}: {record.getMessage()}" for row, matched in found.items() for record in matched
             if (record.exc_info is not None) != row.with_traceback]
    assert not wrong, "a traceback where none belongs, or none with the give-up:\n" + "\n".join(wrong)


# The lines a process logs right before it exits (``os._exit``), which a test cannot let happen
# in its own: proven by a process of their own (the slow test at the end), not by the run here.
LOGGED_BEFORE_AN_EXIT = ("compensation scan: a chunk of ",)


def before_an_exit(row: Documented) -> bool:
    """Whether the row is one of ``LOGGED_BEFORE_AN_EXIT``."""
    return row.line.startswith(LOGGED_BEFORE_AN_EXIT)


# The test project's log format (testproject/settings.py LOGGING), as a process writes it.
PROCESS_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<name>\S+) (?P<message>.*)")


def records_of(output: str) -> list[logging.LogRecord]:
    """A process's log lines as records: a traceback on the lines after one is its ``exc_info``,
    any other line there the rest of its message (a message that broke across lines)."""
    records: list[logging.LogRecord] = []
    in_traceback = False
    for line in output.splitlines():
        logged = PROCESS_LINE.fullmatch(line)
        if logged:
            records.append(logging.makeLogRecord({
                "name": logged["name"], "levelname": logged["level"], "msg": logged["message"],
                "levelno": logging.getLevelName(logged["level"])}))
            in_traceback = False
        elif not records:
            continue
        elif in_traceback or line.startswith("Traceback (most recent call last):"):
            records[-1].exc_info = (None, None, None)
            in_traceback = True
        else:
            records[-1].msg += "\n" + line
    return records


def assert_one_line_each(records: list[logging.LogRecord]) -> None:
    """What an alert matches is one line: no message of the app's breaks across lines (an error's
    text is part of many, and some drivers' errors span several)."""
    broken = [f"{record.levelname} {record.getMessage()}" for record in records if "\n" in record.getMessage()]
    assert not broken, "logged across lines:\n" + "\n".join(broken)


def test_the_operations_page_lists_log_lines_with_their_levels() -> None:
    documented = documented_lines()

    assert len(documented) >= 20
    assert {row.level for row in documented} >= {logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL}
    assert len({row.line for row in documented}) == len(documented), "a line listed twice"
    assert [row.line for row in documented if row.with_traceback], "no give-up line listed"


def test_the_table_reader_turns_each_row_into_a_pattern_of_one_line() -> None:
    page = ("# Running it\n\n### Log lines to alert on\n\n| level | line | what it means | what to do |\n"
            "| --- | --- | --- | --- |\n| `WARNING` | `close failed order=… next=…` | a try failed | nothing |\n"
            "| ERROR | `a \\| b …` | x | y |\n\n## Next\n\n| level | line |\n| --- | --- |\n| INFO | `not this` |\n")

    close, piped = documented_lines(page)

    assert (close.level, close.line, piped.level, piped.line) == (
        logging.WARNING, "close failed order=… next=…", logging.ERROR, "a | b …")
    assert close.pattern.fullmatch("close failed order=12 next=retry in 1s")
    assert not close.pattern.fullmatch("close failed order=12\n next=retry in 1s")
    assert not close.pattern.fullmatch("reminder failed order=12 next=retry in 1s")


def record(level: int, message: str, traceback: bool = False) -> logging.LogRecord:
    """A record as the app's logger makes one (``traceback``: with an ``exc_info``)."""
    return logging.makeLogRecord({"name": "order_timeout", "levelno": level, "levelname": logging.getLevelName(level),
                                  "msg": message, "exc_info": (None, None, None) if traceback else None})


def test_a_record_counts_for_the_most_specific_line_and_only_a_give_up_may_carry_a_traceback() -> None:
    """So a general row (any timer's failed try) is proven only by a record no specific row
    matches, and the check of tracebacks holds both ways."""
    timer = Documented(logging.WARNING, "… failed …=… attempt=…")
    close = Documented(logging.WARNING, "close failed order=… attempt=…")
    give_up = Documented(logging.ERROR, "close order=… dead-lettered after … attempts; the last error follows.")
    tried = record(logging.WARNING, "close failed order=5 attempt=1")
    buried = record(logging.ERROR, "close order=5 dead-lettered after 4 attempts; the last error follows.",
                    traceback=True)

    assert credited([timer, close], [tried]) == {timer: [], close: [tried]}
    assert_each_logged([close, give_up], [tried, buried])
    with pytest.raises(AssertionError, match="never logged"):
        assert_each_logged([close, give_up], [tried, record(logging.WARNING, buried.getMessage(), traceback=True)])
    with pytest.raises(AssertionError, match="a traceback where none belongs"):
        assert_each_logged([close, give_up], [record(logging.WARNING, tried.getMessage(), traceback=True), buried])
    with pytest.raises(AssertionError, match="none with the give-up"):
        assert_each_logged([close, give_up], [tried, record(logging.ERROR, buried.getMessage())])


def test_a_process_log_is_read_as_records_with_their_tracebacks() -> None:
    output = ("2026-12-05 12:50:44,202 WARNING order_timeout close failed order=5 attempt=1\n"
              "2026-12-05 12:50:45,000 ERROR order_timeout close order=5 dead-lettered after 2 attempts; the last "
              "error follows.\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
              "RuntimeError: down\n"
              "2026-12-05 12:50:46,000 WARNING order_timeout close failed order=6 error=relation does not exist\n"
              "LINE 1: SELECT 1\n")

    tried, buried, broken = records_of(output)

    assert (tried.levelno, tried.getMessage(), tried.exc_info) == (
        logging.WARNING, "close failed order=5 attempt=1", None)
    assert buried.levelno == logging.ERROR and buried.exc_info is not None
    assert broken.getMessage() == "close failed order=6 error=relation does not exist\nLINE 1: SELECT 1"
    assert broken.exc_info is None
    assert_one_line_each([tried, buried])
    with pytest.raises(AssertionError, match="logged across lines"):
        assert_one_line_each([tried, buried, broken])


# -- the source's logging calls ------------------------------------------------------------------


SOURCE = PROJECT_ROOT / "order_timeout"
# The methods that log at WARNING or above, by their level (``log`` names its own).
LEVELS = {"warning": logging.WARNING, "warn": logging.WARNING, "error": logging.ERROR,
          "exception": logging.ERROR, "critical": logging.CRITICAL, "fatal": logging.CRITICAL}
# A printf-style placeholder, as ``logging`` fills one in (``%%`` is a percent sign, not one).
PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")


@dataclass(frozen=True)
class LoggingCall:
    """One call in the source that logs at WARNING or above: where, at what level, and its line as
    the page would write it (each placeholder ``…``; None when the source does not say)."""

    where: str
    level: int | None
    line: str | None

    @property
    def pattern(self) -> re.Pattern[str]:
        """The line with each ``…`` standing for anything on one line: a row may say more of what a
        placeholder writes (``close`` for ``%s``, ``order=…`` for ``%s``), never less."""
        assert self.line is not None
        return re.compile(".*?".join(re.escape(part) for part in self.line.split(VARIES)))

    def writes(self, row: Documented) -> bool:
        """Whether a record of this call can be the row's line, at the row's level."""
        return self.line is not None and self.level == row.level and self.pattern.fullmatch(row.line) is not None

    def __str__(self) -> str:
        level = "?" if self.level is None else logging.getLevelName(self.level)
        return f"{self.where}: {level} {self.line if self.line is not None else '(its line is not in the source)'}"


def logging_calls(source: str, where: str) -> list[LoggingCall]:
    """The calls of a module's source that log at WARNING or above, read with ``ast``: a method of
    a name bound to ``logging.getLogger(...)`` (or of the call itself, or of ``logging``). Its format
    string is read from literals, module constants and f-strings; its level from ``logging.X``."""
    tree = ast.parse(source)
    constants = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}

    def is_get_logger(node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "getLogger")

    loggers = {"logging"} | {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                             and is_get_logger(node.value) for target in node.targets
                             if isinstance(target, ast.Name)}

    def text(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Name) and node.id in constants:
            return text(constants[node.id])
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return PLACEHOLDER.sub(lambda placeholder: "%" if placeholder.group() == "%%" else VARIES, node.value)
        if isinstance(node, ast.JoinedStr):
            parts = [text(value) if isinstance(value, ast.Constant) else VARIES for value in node.values]
            return None if None in parts else "".join(str(part) for part in parts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = text(node.left), text(node.right)
            return None if left is None or right is None else left + right
        return None

    def level(node: ast.AST) -> int | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "logging":
            value = getattr(logging, node.attr, None)
            return value if isinstance(value, int) else None
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        return None

    calls = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver, method = node.func.value, node.func.attr
        if not (isinstance(receiver, ast.Name) and receiver.id in loggers or is_get_logger(receiver)):
            continue
        if method == "log":
            at = level(node.args[0]) if node.args else None
            message = node.args[1] if len(node.args) > 1 else None
        elif method in LEVELS:
            at, message = LEVELS[method], node.args[0] if node.args else None
        else:
            continue
        if at is None or at >= logging.WARNING:
            line = text(message)
            # A run of placeholders writes what one would: one ``…``, as the page writes it.
            calls.append(LoggingCall(f"{where}:{node.lineno}", at,
                                     None if line is None else re.sub(f"(?:{VARIES})+", VARIES, line)))
    return calls


def app_logging_calls() -> list[LoggingCall]:
    """Every call at WARNING or above in the app's modules (its migrations log nothing of the kind)."""
    return [call for path in sorted(SOURCE.rglob("*.py")) if "migrations" not in path.relative_to(SOURCE).parts
            for call in logging_calls(path.read_text(encoding="utf-8"), str(path.relative_to(PROJECT_ROOT)))]


def unlisted(calls: list[LoggingCall], documented: list[Documented]) -> list[LoggingCall]:
    """The calls no row of the page stands for (and those whose line or level the source does not say)."""
    return [call for call in calls if not any(call.writes(row) for row in documented)]


def test_the_source_reader_finds_a_call_the_page_does_not_list() -> None:
    """So the check of the source cannot pass by finding nothing: a module with a listed call, an
    unlisted one, one at a level the row does not say, and calls that are no alert."""
    source = (
        'import logging\n'
        'logger = logging.getLogger("order_timeout")\n'
        'REBUILT = "Rebuilt %d member(s), 100%% of them."\n'
        'def renew(kind, leases, exc, metrics):\n'
        '    logger.info("%s: renewed %d lease(s)", kind, leases)\n'
        '    metrics.error("redis")\n'
        '    logger.warning("%s: could not renew %d lease(s) (%s: %s); trying again in %.0fs.", kind, leases,\n'
        '                   type(exc).__name__, exc, 1.0)\n'
        '    logger.log(logging.ERROR, "the leases " "ran out: %r", leases)\n'
        '    logger.exception(REBUILT, leases)\n'
        '    logging.getLogger("order_timeout").critical(f"{kind}: stuck")\n'
        '    logger.warning(kind.wording)\n')
    documented = [Documented(logging.WARNING, "close: could not renew … lease(s) (…: …); trying again in …s."),
                  Documented(logging.WARNING, "the leases ran out: …"),
                  Documented(logging.ERROR, "Rebuilt … member(s), 100% of them."),
                  Documented(logging.CRITICAL, "…: stuck")]

    calls = logging_calls(source, "shop.py")

    assert [(call.where, call.level, call.line) for call in calls] == [
        ("shop.py:7", logging.WARNING, "…: could not renew … lease(s) (…: …); trying again in …s."),
        ("shop.py:9", logging.ERROR, "the leases ran out: …"),
        ("shop.py:10", logging.ERROR, "Rebuilt … member(s), 100% of them."),
        ("shop.py:11", logging.CRITICAL, "…: stuck"),
        ("shop.py:12", logging.WARNING, None)]
    assert unlisted(calls, documented) == [calls[1], calls[4]]
    assert not calls[0].writes(Documented(logging.WARNING, "close: could not renew the leases"))


def test_every_logging_call_at_warning_or_above_has_its_row_on_the_page() -> None:
    calls = app_logging_calls()

    assert calls, f"no logging call at WARNING or above found under {SOURCE}"
    missing = unlisted(calls, documented_lines())
    assert not missing, f"{len(missing)} of {len(calls)} calls at WARNING or above have no row in {SECTION!r}:\n" + (
        "\n".join(map(str, missing)))


def test_every_row_at_warning_or_above_is_written_by_a_call_in_the_source() -> None:
    calls = app_logging_calls()

    orphans = [f"{logging.getLevelName(row.level)} {row.line}" for row in documented_lines()
               if row.level >= logging.WARNING and not any(call.writes(row) for call in calls)]
    assert not orphans, "listed on the page, written by no call in the source:\n" + "\n".join(orphans)


# The rows the run below does not produce, each named by a part of its line: proven by the source
# alone (the test above ties each to the call that writes it). Why a run would cost more than it proves:
PROVEN_BY_THE_SOURCE = (
    # A bug's line, which carries its traceback (a run here allows the give-up's only).
    "Could not rebuild the queue; closing on",
    "The heartbeat failed a beat",
    "A heartbeat's look at the pauses failed",
    "The lease guard failed a step",
    "Could not end the database session … of a dead consumer.",
    # A policy that raises at checkout: its traceback follows, as docs/payments.md tells a shop.
    "DEADLINE_POLICY … raised for",
    # Redis lost between two steps of one compensation scan, a give-back or a consumer's exit: only a
    # hook inside the code could time it.
    "compensation scan lost Redis while restoring members",
    "compensation scan could not record the drift",
    "compensation scan lost Redis (…); going on without the lock",
    "compensation scan could not release its lock",
    "compensation scan could not record where the next one starts",
    "compensation scan lost Redis (…); acting on what the database says is overdue",
    "compensation scan could not hand members back",
    "compensation scan could not count its failures in Redis",
    "compensation scan could not keep its books in Redis",
    "compensation scan could not put held rows back in Redis",
    "compensation scan could not clean up Redis",
    "could not put back in Redis the members it lacked after the give-back",
    "Could not ack the last batch on leaving",
    # The database lost between a two-trip batch's trips (tests/test_round_trips.py shows it).
    "Could not roll back a batch's transaction",
    # The database lost between a turn's end and its record, or at a heartbeat's look at the pauses.
    "could not read the database's clock to record its end",
    "Could not read the timers' pauses",
    # A chunk that outlives the scan's lock, rows locked elsewhere through a give-back's rounds: seconds.
    "compensation scan lost its lock (a chunk outlived it)",
    "stayed locked elsewhere through the give-back",
    # A grant the test servers give: ending another session, the wake-up channels (an ACL user).
    "Could not end database session",
    "on the wake-up channels",
)


def proven_by_the_source(row: Documented) -> bool:
    """Whether the row is one of ``PROVEN_BY_THE_SOURCE``."""
    return any(part in row.line for part in PROVEN_BY_THE_SOURCE)


def test_each_row_proven_by_the_source_alone_is_named_once_and_is_on_the_page() -> None:
    documented = documented_lines()

    named = {part: [row.line for row in documented if part in row.line] for part in PROVEN_BY_THE_SOURCE}

    assert not [part for part, rows in named.items() if len(rows) != 1], named
    assert all(row.level >= logging.WARNING for row in documented if proven_by_the_source(row))


# -- the scenarios ---------------------------------------------------------------------------


class StockServiceDown(Exception):
    """What a shop's receiver raises when the service it calls is down: an expected failure."""


@dataclass
class Run:
    """What every scenario works with: the test's fixtures, and the records logged so far."""

    settings: Any
    clock: Clock
    consumer: Callable[..., Consumer]
    make_order: Callable[..., Any]
    monkeypatch: pytest.MonkeyPatch
    redis: PrivateRedis
    caplog: pytest.LogCaptureFixture

    @property
    def queue(self) -> TimeoutQueue:
        return TimeoutQueue.from_settings()

    @contextmanager
    def configured(self, **options: Any) -> Iterator[None]:
        """These ORDER_TIMEOUT settings for the block, as they were after it."""
        before = self.settings.ORDER_TIMEOUT
        self.settings.ORDER_TIMEOUT = {**before, **options}
        try:
            yield
        finally:
            self.settings.ORDER_TIMEOUT = before

    def now(self) -> datetime:
        """The test clock, set to the host's time: each scenario starts there (the database judges
        a row due by its own clock, and a consumer in a thread runs on the host's)."""
        self.clock.current = timezone.now()
        return self.clock.current

    def logged(self, text: str) -> bool:
        return any(text in record.getMessage() for record in self.caplog.records)

    def due(self, seconds_ago: float = 5) -> Any:
        """An unpaid order due ``seconds_ago``, scheduled."""
        self.now()
        return self.make_order(in_seconds=-seconds_ago)


@contextmanager
def connected(signal: Signal, receiver: Callable[..., Any]) -> Iterator[None]:
    """``receiver`` on ``signal`` for the block only: the next scenario's rows must not meet it."""
    signal.connect(receiver, weak=False)
    try:
        yield
    finally:
        signal.disconnect(receiver)


def failing_for(*rows: Any) -> Callable[[Any], None]:
    """A step of a row's act (a receiver, a fire()) that raises for these rows: a stock service down."""
    pks = {row.pk for row in rows}

    def release_stock(row: Any) -> None:
        if row.pk in pks:
            raise StockServiceDown(f"cannot release the stock of {row.pk}")

    return release_stock


def refusing(*orders: Any) -> Callable[..., None]:
    """An ``order_expired`` receiver that raises for these orders."""
    release_stock = failing_for(*orders)

    def receiver(sender: Any, order: Any, **kwargs: Any) -> None:
        release_stock(order)

    return receiver


def a_consumer_waits_for_migrate(run: Run) -> None:
    """A database that lacks the app's last migration (its record taken out of ``django_migrations``,
    put back as ``migrate`` would: quicker than undoing its DDL, and all the consumer asks)."""
    recorder = MigrationRecorder(connection)
    last = recorder.migration_qs.filter(app="order_timeout").order_by("-name").first()
    assert last is not None
    last.delete()
    worker = Consumer(max_wait=0.05)
    try:
        with running(worker):
            wait_for(lambda: run.logged("Migrations not applied yet"))
            compensate_task()  # the scan's Celery task skips its run too
            recorder.record_applied(last.app, last.name)
            wait_for(lambda: run.logged("The migrations are applied"))
    finally:
        if not recorder.migration_qs.filter(app=last.app, name=last.name).exists():
            recorder.record_applied(last.app, last.name)


def a_receiver_stuck_outside_the_database_past_the_batch_time_limit(run: Run) -> None:
    """The batch is given up after BATCH_TIME_LIMIT, then reported stuck (the consumer process would
    exit; one in a thread is not told to)."""
    held = HeldReceiver()
    order = run.due()
    worker = Consumer(max_wait=0.05, lease_seconds=30, batch_time_limit=1)
    with connected(order_expired, held), running(worker):
        try:
            wait_for(held.inside.is_set)
            wait_for(lambda: run.logged("a receiver is stuck outside the database"))
        finally:
            held.release.set()  # before the consumer is asked to stop: it waits for the receiver
        wait_for(lambda: state(order) == "closed")  # taken over, by the same consumer here


def a_dead_consumers_batch_and_session_are_taken_over(run: Run) -> None:
    """A consumer that claimed a batch, its session open, and stopped beating."""
    orders = [run.due(seconds_ago=10) for _ in range(3)]
    queue = run.queue
    # Its last beat 5 s ago: found dead 3 s ago, so the leases it hands over are due now.
    now_ms = now_score(run.now()) - 5000
    dead = connections.create_connection("default")
    dead.ensure_connection()
    try:
        for shard in queue.shards:
            shard.heartbeat("dead", now_ms, now_ms + 1500, f"default\x1f{session_identity(dead)}")
        assert len(claim_everywhere(queue, now_ms, len(orders), now_ms + 30_000, "dead:0")) == len(orders)
        worker = run.consumer()
        Heartbeat(worker.lanes, "alive", 1.5, lambda: now_ms + 2000).beat()
    finally:
        dead.close()
    worker.run(once=True)  # what it handed over is closed


def every_kind_fails_and_is_given_up(run: Run) -> None:
    """A row of each kind whose act raises, tried twice (one retry) and given up: the close, a
    reminder, a declared timer, and a notice whose target is down."""
    run.now()
    with ExitStack() as stack:
        stack.enter_context(run.configured(RETRY_DELAYS=[1], NOTICE_RETRY_DELAYS=[1]))
        cases: list[Case] = [CloseCase(run.settings, run.clock, run.monkeypatch),
                             ReminderCase(run.settings, run.clock, run.monkeypatch),
                             ReservationCase(run.settings, run.clock, run.monkeypatch)]
        for case in cases:
            stack.callback(case.close)
            # Two rows, one failing: a declared timer's fire() fails the batch first, then that row alone.
            unlucky, _ = case.make(2, in_seconds=-5)
            case.on_each_row(failing_for(unlucky))

        def target_down(delivery: Any) -> None:
            raise ConnectionError("the SMTP server is down")

        handlers.declare("log-lines-mail", target_down, timeout=5)
        stack.callback(handlers.forget, "log-lines-mail")
        notify("log-lines-mail", {"to": "buyer@example.com"})
        worker = run.consumer(kinds=[ORDER_TIMEOUT, REMINDERS, NOTICES, cases[-1].kind])
        run.now()
        worker.run(once=True)
        run.clock.advance(1)
        worker.run(once=True)


def a_receiver_the_database_refuses_and_a_dead_letter_that_cannot_be_written(run: Run) -> None:
    """A receiver's query fails in the database (a table it needs is missing: PostgreSQL tells it on
    three lines), and the dead letter cannot be written either until its table is back."""
    run.due()

    def query_a_missing_table(sender: Any, order: Any, **kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM log_lines_no_such_table")

    with run.configured(RETRY_DELAYS=[]), connected(order_expired, query_a_missing_table):
        with broken_dead_letter_table():
            run.consumer().run(once=True)
        run.clock.advance(order_settings.LEASE_SECONDS)
        run.consumer().run(once=True)  # buried once the table is back


def a_member_taken_over_too_often(run: Run) -> None:
    """Its consumers died with it MAX_TAKEOVERS times (a receiver that kills them): buried untried."""
    order = run.due()
    queue, member = run.queue, str(order.pk)
    queue.client.hset(keys_for(queue, member).takeovers, member, order_settings.MAX_TAKEOVERS)
    now_ms = now_score(run.clock())
    assert claim_everywhere(queue, now_ms, 1, now_ms - 1, "a-consumer-that-died") == [member]
    run.consumer().run(once=True)


def members_that_name_no_order(run: Run) -> None:
    """Another program wrote the queue: a member no order has, one that is not UTF-8, and the key of
    an order that is not there (deleted without being unscheduled)."""
    queue = run.queue
    now_ms = now_score(run.now())
    queue.schedule({"not-an-id": now_ms - 10, "987654321": now_ms - 10})
    queue.client.zadd(queue.shards[0].keys.pending, {b"\xff\xfe": now_ms - 10})
    run.due()
    run.consumer().run(once=True)


def redis_loses_the_queue(run: Run) -> None:
    """Redis comes back empty under a running queue: the next beat's consumer rebuilds it."""
    worker = run.consumer()
    worker.recovery.run()  # the queue set up: its epoch in the database and in Redis
    run.make_order(in_seconds=3600)
    lose_redis_data(run.queue)
    assert worker.recovery.run()


def the_scan_buries_a_row_its_runs_died_with(run: Run) -> None:
    """Scans that died acting on this row (a receiver that exits) more than MAX_TAKEOVERS times."""
    order = run.due(seconds_ago=600)
    unschedule([order])
    queue, member = run.queue, str(order.pk)
    queue.client.hset(queue.global_keys.scanning, member, order_settings.MAX_TAKEOVERS + 1)
    compensate(now=run.now())


def the_prune(run: Run) -> None:
    """The beat's prune, which logs what it deleted each time it runs."""
    prune()


def the_fleets_housekeeping(run: Run) -> None:
    """A turn that lapsed under its runner (frozen past COMPENSATION_LOCK_SECONDS), and a
    housekeeping thread whose run raised."""
    with run.configured(COMPENSATION_LOCK_SECONDS=0.1):
        frozen = take_turn(PRUNE, "consumer", interval=None)
        assert frozen is not None
        time.sleep(0.15)  # the lock lapses: the behaviour shown needs it to
        frozen.renew()
        frozen.end(complete=True, figures={})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(housekeeper, "run_scan", failing_scan)
        Housekeeper(threading.Event()).look_once()


def refused_writes(run: Run) -> None:
    """A payment after the close, recorded for staff; its order then paid by the shop's own path,
    settled by itself; a refusal whose record the database will not take; a settle it fails."""
    def closed() -> Any:
        order = run.due()
        type(order).objects.filter(pk=order.pk).update(status="closed", closed_at=timezone.now())
        return type(order).objects.get(pk=order.pk)

    paid_late = closed()
    with pytest.raises(OrderClosed):
        paid_late.mark_paid()
    type(paid_late).objects.filter(pk=paid_late.pk).update(status="paid")
    refusals.settle()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "insert_apart", database_gone)
        with pytest.raises(OrderClosed):
            closed().mark_paid()
        patch.setattr(turns.refusals, "settle", database_gone)
        turns._settle_refused_writes()


def database_gone(*args: Any, **kwargs: Any) -> None:
    raise OperationalError("the database is gone")


def failing_scan(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("a bug in the scan")


def a_consumer_started_while_its_database_is_down(run: Run) -> None:
    """It cannot ask which migrations are applied nor read the database's clock: it says so, goes on,
    and its batches fail until the database is back."""
    worker = Consumer(max_wait=0.05)

    def run_without_a_database() -> None:
        # Connections are per thread: only this one's points at a closed port.
        gone = connections["default"]
        gone.settings_dict = {**gone.settings_dict, "HOST": "127.0.0.1", "PORT": 1}
        try:
            worker.run()
        finally:
            gone.close()

    with running(worker, target=run_without_a_database):
        wait_for(lambda: worker.stats.errors >= 1)


def naive_deadline(order: Any) -> datetime:
    """DEADLINE_POLICY as a shop may get it wrong: a deadline without its time zone."""
    return datetime(2030, 1, 1, 12, 0)


def a_policy_that_answers_no_deadline(run: Run) -> None:
    """An order saved under it gets the default deadline, and a re-date leaves the deadlines as they were."""
    with run.configured(DEADLINE_POLICY="tests.test_log_lines.naive_deadline"):
        get_order_model().objects.create()
        Redate().run()


def redis_stopped(run: Run) -> None:
    """Redis goes right after a consumer claimed a batch the database then fails: the batch can be
    neither acted on nor put back. With Redis down: a turn cannot record its end, the leases of a batch
    in hand can be neither renewed nor handed over, a save cannot schedule its order nor a notice be
    announced, a pause is not told, a scrape cannot read the backlog, the prune can neither trim the
    quarantine nor record its figures, the scan works without its lock (and a close it tries fails),
    a consumer cannot beat nor claim. Redis is started again, empty, at the end."""
    turn = take_turn(PRUNE, "consumer", interval=None)
    assert turn is not None
    run.due()
    claimed = run.consumer(metrics=OutageRightAfterTheClaim(run.redis))
    failed: list[DatabaseError] = []

    def claim_until_the_outage() -> None:
        try:
            while not failed:
                claimed.run_once()
        except DatabaseError as exc:
            failed.append(exc)
        finally:
            connections["default"].close()  # this thread's, pointed at a closed port

    try:
        batch = threading.Thread(target=claim_until_the_outage)
        batch.start()
        batch.join(time_left())
        assert failed, "the batch never met the outage"
        turn.end(complete=True, figures={})
        # A batch of reminders in hand, past its time limit.
        guard = LeaseGuard(run.queue, 0.6, lambda: now_score(timezone.now()))
        try:
            with guard.watching("a-token", ["1"], None, "default", queue=run.queue.of_kind(REMINDERS.key_space)):
                wait_for(lambda: run.logged("the batch given up ("))
        finally:
            guard.close()
        order = run.due(seconds_ago=600)  # its save cannot reach Redis
        handlers.declare("log-lines-mail", lambda delivery: None, timeout=5)
        try:
            notify("log-lines-mail", {"to": "buyer@example.com"})  # nor its notice be announced
        finally:
            handlers.forget("log-lines-mail")
        pause(["reservation-lapses"], "stock service down", known=known_names())
        resume(["reservation-lapses"])
        list(BacklogCollector().collect())  # a scrape
        prune()  # run by hand: its turn is not taken
        with connected(order_expired, refusing(order)):
            compensate(now=run.now())
        run_scan("consumer")  # the fleet's turn cannot be taken: the scan runs without its lock
        run_prune("consumer")  # and the prune waits
        worker = Consumer(max_wait=0.05)
        with running(worker):
            wait_for(lambda: worker.stats.errors >= 1)
    finally:
        run.redis.start()


# In this order: the last stops Redis (and starts it again, empty).
SCENARIOS = [
    a_consumer_waits_for_migrate,
    a_receiver_stuck_outside_the_database_past_the_batch_time_limit,
    a_dead_consumers_batch_and_session_are_taken_over,
    every_kind_fails_and_is_given_up,
    a_receiver_the_database_refuses_and_a_dead_letter_that_cannot_be_written,
    a_member_taken_over_too_often,
    members_that_name_no_order,
    redis_loses_the_queue,
    the_scan_buries_a_row_its_runs_died_with,
    the_prune,
    the_fleets_housekeeping,
    refused_writes,
    a_consumer_started_while_its_database_is_down,
    a_policy_that_answers_no_deadline,
    redis_stopped,
]


@pytest.mark.django_db(transaction=True)
def test_every_listed_line_is_logged_by_a_real_run_on_one_line_and_only_a_give_up_carries_a_traceback(
        settings: Any, clock: Clock, consumer: Callable[..., Consumer], make_order: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture) -> None:
    documented = [row for row in documented_lines() if not before_an_exit(row) and not proven_by_the_source(row)]
    run = Run(settings, clock, consumer, make_order, monkeypatch, private_redis, caplog)

    with caplog.at_level(logging.INFO, logger="order_timeout"):
        for scenario in SCENARIOS:
            scenario(run)

    records = [record for record in caplog.records if record.name == "order_timeout"]
    assert_one_line_each(records)
    assert_each_logged(documented, records)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_lines_logged_before_an_exit_are_logged_by_a_real_process(make_order: Callable[..., Any],
                                                                     queue: TimeoutQueue) -> None:
    """The compensation command, its scan stuck in a receiver outside the database: it says so, and exits."""
    exiting = [row for row in documented_lines() if before_an_exit(row)]
    assert len(exiting) == len(LOGGED_BEFORE_AN_EXIT), "a line named here that the page does not list"
    order = make_order(in_seconds=-600)
    queue.unschedule([str(order.pk)])  # Redis lost it: the scan's to close
    env = {**os.environ, "DATABASE_URL": database_url(), "SHOP_HANG_ON_ORDER": str(order.pk),
           "ORDER_TIMEOUT_LEASE_SECONDS": "1"}

    scan = subprocess.run([sys.executable, "manage.py", "order_timeout_compensate"], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=time_left())

    assert scan.returncode == EXIT_STUCK, scan.stderr
    records = [record for record in records_of(scan.stderr) if record.name == "order_timeout"]
    assert_one_line_each(records)
    assert_each_logged(exiting, records)
