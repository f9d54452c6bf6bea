"""The previous release and this one, side by side on one database and one Redis, as a shop
rolls an upgrade (docs/upgrading.md).

The previous release (``releases.toml``) runs from its own tree in its own virtual environment
(``tests/releases.py``): its consumers and a web process of its shop, on the database as it left
it (the app's migrations after its last one unapplied). Today's ``manage.py migrate`` runs while
they work; they go on alone on the new schema for a while (doomed orders meanwhile bury
themselves in dead letters written by the previous release); then today's consumers and web
process start beside them; once work has crossed between the releases both ways, the previous
release's processes are stopped with SIGTERM, as docs/upgrading.md says, and today's carry on.

Every process runs ``tests/rolling/``'s settings over its release's own test project: the same
retry delays, and a receiver that fails for good on every tenth order and logs each close that
committed. Then every promise is judged across the switch, from the tables and those logs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from order_timeout.models import DeadLetter, Order
from testproject.shop.models import Expiry

from .conftest import PROJECT_ROOT, ConsumerProcess, wait_for
from .migrating import app_migrated_to
from .releases import ReleaseEnvironment, environment, previous_release
from .rolling.rolling_receivers import doomed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROLLING = Path(__file__).parent / "rolling"
# Both releases retry a failed close after these delays, then write a dead letter.
RETRY_DELAYS = [0.5, 0.5, 1.0]
ATTEMPTS = len(RETRY_DELAYS) + 1
CONSUMERS = 2
# Seconds an order may close after its deadline here: less than the 30 s lease, so no batch
# waited for a lease to run out (a consumer stopped with SIGTERM leaves none behind).
LATE_BOUND = timedelta(seconds=20)
# How long each step lasts, in work done: closes and dead letters of the previous release on its
# own schema before the migrate, its dead letters on the new one before today's processes start,
# the orders today's web process places beside it, then alone.
CLOSES_BEFORE_MIGRATE = 30
LETTERS_BEFORE_MIGRATE = 1
LETTERS_AFTER_MIGRATE = 2
ORDERS_SIDE_BY_SIDE = 80
ORDERS_AFTER_THE_SWITCH = 16


@dataclass
class Side:
    """One release's code (which interpreter runs which tree), and how the test starts a process."""

    python: Path
    tree: Path
    start: Callable[..., ConsumerProcess]

    def run(self, *command: str | Path) -> ConsumerProcess:
        env = {"DJANGO_SETTINGS_MODULE": "rolling_settings", "PYTHONPATH": f"{self.tree}{os.pathsep}{ROLLING}",
               "ROLLING_RETRY_DELAYS": json.dumps(RETRY_DELAYS)}
        return self.start(command=[str(self.python), *map(str, command)], cwd=self.tree, env=env)

    def manage(self, *args: str) -> ConsumerProcess:
        return self.run(self.tree / "manage.py", *args)

    def consumer(self) -> ConsumerProcess:
        return self.manage("run_timeout_consumer")

    def shop(self) -> ConsumerProcess:
        return self.run(ROLLING / "rolling_shop.py")


@pytest.fixture
def previous() -> ReleaseEnvironment:
    """The previous release's tree and environment (built the first time, then reused)."""
    return environment(previous_release())


def closed_by(consumers: Iterable[ConsumerProcess]) -> Counter[int]:
    """The orders these consumers closed (a close that committed), each as often as it did."""
    return Counter(int(pk) for consumer in consumers for pk in re.findall(r"rolling: closed order (\d+)", consumer.err))


def events(shop: ConsumerProcess, kind: str) -> list[dict[str, Any]]:
    return [event for line in shop.out.splitlines() if line.startswith("{")
            and (event := json.loads(line))["event"] == kind]


def placed(shop: ConsumerProcess) -> set[int]:
    return {event["pk"] for event in events(shop, "order")}


def settled(orders: set[int]) -> bool:
    """Every order paid, closed, or (a doomed one) in an open dead letter."""
    unpaid = set(Order.objects.filter(pk__in=orders, status=Order.Status.UNPAID).values_list("pk", flat=True))
    buried = {int(pk) for pk in DeadLetter.objects.filter(resolved_at__isnull=True).values_list("order_id", flat=True)}
    return unpaid <= buried


def wait_while_running(running: list[ConsumerProcess], predicate: Callable[[], bool]) -> None:
    """Wait for ``predicate`` while every one of ``running`` runs; fail at once, with its output, if one exits."""
    wait_for(lambda: predicate() or any(process.proc.poll() is not None for process in running))
    assert [process.err for process in running if process.proc.poll() is not None] == []


def stop(*running: ConsumerProcess) -> list[tuple[int, str, str]]:
    """SIGTERM, as docs/upgrading.md stops the previous release; each one's exit and output."""
    for process in running:
        process.signal(signal.SIGTERM)
    return [process.wait() for process in running]


def test_the_previous_release_beside_this_one_keeps_every_promise_across_the_upgrade(
        previous, consumer_process, transactional_db):
    old = Side(previous.python, previous.tree, consumer_process)
    new = Side(Path(sys.executable), PROJECT_ROOT, consumer_process)

    with app_migrated_to(previous.release.last_migration()):
        # The previous release alone, on the schema it made.
        old_consumers = [old.consumer() for _ in range(CONSUMERS)]
        old_shop = old.shop()
        wait_while_running([*old_consumers, old_shop],
                           lambda: sum(closed_by(old_consumers).values()) >= CLOSES_BEFORE_MIGRATE
                           and DeadLetter.objects.count() >= LETTERS_BEFORE_MIGRATE)

        # Today's migrate while it works; then it goes on alone on the new schema.
        letters_before = set(DeadLetter.objects.values_list("pk", flat=True))
        code, _, err = new.manage("migrate", "--noinput").wait()
        assert code == 0, err
        migrated_at = datetime.now().astimezone()
        logged_before = [len(consumer.err) for consumer in old_consumers]

        def failed_since_the_migrate() -> list[str]:
            """The previous release's log lines since the migrate that say a write failed on the new schema."""
            return [line for consumer, offset in zip(old_consumers, logged_before, strict=True)
                    for line in consumer.err[offset:].splitlines() if "IntegrityError" in line]

        wait_while_running([*old_consumers, old_shop],
                           lambda: DeadLetter.objects.exclude(pk__in=letters_before).count() >= LETTERS_AFTER_MIGRATE
                           or bool(failed_since_the_migrate()))
        assert failed_since_the_migrate() == []
        written_by_old = list(DeadLetter.objects.exclude(pk__in=letters_before))

        # Today's consumers and web process beside it, until work crossed both ways.
        new_consumers = [new.consumer() for _ in range(CONSUMERS)]
        new_shop = new.shop()
        wait_while_running([*old_consumers, old_shop, *new_consumers, new_shop],
                           lambda: len(placed(new_shop)) >= ORDERS_SIDE_BY_SIDE
                           and bool(placed(old_shop) & set(closed_by(new_consumers)))
                           and bool(placed(new_shop) & set(closed_by(old_consumers))))

        # The previous release stopped; today's alone, then its web process too, and everything settles.
        old_exits = stop(*old_consumers, old_shop)
        placed_at_switch = len(placed(new_shop))
        wait_while_running([*new_consumers, new_shop],
                           lambda: len(placed(new_shop)) >= placed_at_switch + ORDERS_AFTER_THE_SWITCH)
        new_shop_exit = stop(new_shop)
        shops = (old_shop, new_shop)
        orders = {pk for shop in shops for pk in placed(shop)}
        wait_while_running(new_consumers, lambda: settled(orders))
        new_exits = stop(*new_consumers)

    assert [code for code, _, _ in [*old_exits, *new_shop_exit, *new_exits]] == [0] * (2 * CONSUMERS + 2), [
        err for _, _, err in [*old_exits, *new_shop_exit, *new_exits]]
    rows = {row["pk"]: row for row in Order.objects.values("pk", "status", "expires_at", "closed_at")}
    paid = {pk for pk, row in rows.items() if row["status"] == Order.Status.PAID}
    closed = {pk for pk, row in rows.items() if row["status"] == Order.Status.CLOSED}
    closes = closed_by([*old_consumers, *new_consumers])
    expiries = Counter(int(pk) for pk in Expiry.objects.values_list("order_id", flat=True))
    payments = [event for shop in shops for event in events(shop, "payment")]
    letters = {int(letter.order_id): letter for letter in DeadLetter.objects.filter(resolved_at__isnull=True)}

    # Every order the web processes placed is in the table, and nothing else.
    assert set(rows) == orders
    # A paid order is never closed.
    assert not paid & (set(closes) | set(expiries))
    assert {event["pk"] for event in payments if event["answer"] == "paid"} <= paid
    # A payment made before the deadline, by the database's clock, is never refused.
    assert [event for event in payments if event["answer"] == "refused"
            and datetime.fromisoformat(event["ended"]) < rows[event["pk"]]["expires_at"]] == []
    assert {event["pk"] for event in payments if event["answer"] == "refused"} <= closed
    # An expired unpaid order is closed exactly once, whichever release closed it.
    assert expiries == Counter(closed)
    assert closes == Counter(closed)
    # Nothing lost: every unpaid order closed within the bound, or (a doomed one) buried.
    assert orders - paid - closed == {pk for pk in orders if doomed(pk)} == set(letters)
    late = {pk: rows[pk]["closed_at"] - rows[pk]["expires_at"] for pk in closed}
    assert max(late.values()) <= LATE_BOUND, sorted(late.items(), key=lambda item: item[1])[-3:]
    # The previous release's dead letters after the migrate: written, with the new column's default
    # (as those it wrote before, and today's).
    assert len(written_by_old) >= LETTERS_AFTER_MIGRATE
    assert {letter.timer for letter in written_by_old} == {letter.timer for letter in letters.values()} == {""}
    # And each doomed order tried as often as the retry delays say, whichever release buried it, when
    # its tries began after the migrate.
    assert {pk: letter.attempts for pk, letter in letters.items() if letter.first_failed_at > migrated_at} == {
        pk: ATTEMPTS for pk, letter in letters.items() if letter.first_failed_at > migrated_at}
    # Work crossed between the releases both ways.
    assert placed(old_shop) & set(closed_by(new_consumers)) and placed(new_shop) & set(closed_by(old_consumers))
