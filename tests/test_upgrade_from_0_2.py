"""A Redis written by 0.2.0 (commit 165817b) keeps working after the upgrade.

The queue is written with 0.2's own Lua scripts (``tests/data/redis_0_2/``, copied from
165817b), under 0.2's key names (its ``keys.py``), shard function, member encoding (its
``codec.py``) and the arguments its ``queue.py`` passed each script, as 0.2's consumers and
saves left it when they were stopped for the upgrade: members due and in the future, a batch
whose consumer was killed, one taken over once and killed again, one taken over and found
locked, one in retry, held and busy marks, reminders pending and one leased. Then today's
consumer, scan and status command carry on from there.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db.models import Q

from order_timeout.consumer import Consumer
from order_timeout.models import DeadLetter, Reminder
from order_timeout.queue import Claim
from order_timeout.scans.compensation import compensate
from testproject.shop.models import OrderPayment, Payment, PaymentState, ReminderEmail, ShopOrder

from .conftest import both_models, both_redis
from .helpers import expiries, lose_redis_data, set_state, state

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPTS = Path(__file__).parent / "data" / "redis_0_2"
# Each script's git blob id in 165817b's tree: the copies are 0.2's, byte for byte.
BLOBS = {"claim": "ee26a3bcc697acb8e8b28dfb6eb51eebd5e12bbc",
         "reschedule": "540d8a809bae6f2e5d4e30f418c35ff6ec240416",
         "retry": "980f754a599795d7a8d5b6128d9e8293f35964bf",
         "schedule": "8fe1d359c66cb3cdd54237ec44b1e385b393d09e"}

# 0.2's defaults, which its consumers used: LEASE_SECONDS, HOLD_RECHECK, BUSY_RETRY_MS.
LEASE_MS = 30_000
RECHECK_MS = 30_000
BUSY_RETRY_MS = 1000
# The settings both releases run with here.
RETRY_DELAYS = [1, 2, 4]
REMINDERS = [660, 60]
CLOSE, REMIND = "", "remind"


class Queue02:
    """0.2's queue, written as its code wrote it (165817b's keys.py, codec.py, queue.py)."""

    def __init__(self, client: Any, prefix: str, shards: int) -> None:
        self.client, self.prefix, self.shards = client, prefix, shards
        self.scripts = {name: client.register_script((SCRIPTS / f"{name}.lua").read_text("utf-8"))
                        for name in BLOBS}
        self._claims = 0

    # -- keys.py and codec.py of 0.2 ----------------------------------------------------------

    def shard_of(self, member: str) -> int:
        return zlib.crc32(member.encode()) % self.shards if self.shards > 1 else 0

    def key(self, kind: str, name: str, shard: int) -> str:
        tag = f"{{{self.prefix}}}" if self.shards == 1 else f"{{{self.prefix}:{shard}}}"
        return f"{tag}:{kind}:{name}" if kind else f"{tag}:{name}"

    def keys(self, kind: str, shard: int, *names: str) -> list[str]:
        return [self.key(kind, name, shard) for name in names]

    @staticmethod
    def reminder(pk: Any, lead_seconds: float) -> str:
        return f"{pk}:{round(1000 * lead_seconds)}"

    def by_shard(self, members: Any) -> dict[int, list[str]]:
        grouped: dict[int, list[str]] = {}
        for member in members:
            grouped.setdefault(self.shard_of(member), []).append(member)
        return grouped

    # -- queue.py of 0.2: one call each ---------------------------------------------------------

    def token(self) -> str:
        self._claims += 1
        return f"{uuid.uuid4().hex[:12]}:{self._claims}"

    def schedule(self, kind: str, scores: dict[str, int]) -> None:
        for shard, members in self.by_shard(scores).items():
            args = [value for member in members for value in (scores[member], member)]
            self.scripts["schedule"](keys=self.keys(kind, shard, "pending", "wake"), args=args)

    def claim(self, kind: str, shard: int, now_ms: int, token: str, *, turn: str = "takeover",
              limit: int = 200) -> tuple[list[str], int]:
        reply = self.scripts["claim"](keys=self.keys(kind, shard, "pending", "leased", "owners", "takeovers"),
                                      args=[now_ms, limit, now_ms + LEASE_MS, token, turn])
        return [member.decode() for member in reply[2:]], int(reply[1])

    def claim_everywhere(self, kind: str, now_ms: int) -> dict[str, str]:
        """A consumer going round its lanes once: each shard's due members, a claim (token) each."""
        claimed: dict[str, str] = {}
        for shard in range(self.shards):
            token = self.token()
            members, _ = self.claim(kind, shard, now_ms, token)
            claimed |= dict.fromkeys(members, token)
        return claimed

    def retry(self, kind: str, token: str, member: str, now_ms: int) -> list[Any]:
        delays = [1000 * delay for delay in RETRY_DELAYS]
        return list(self.scripts["retry"](
            keys=self.keys(kind, self.shard_of(member), "pending", "leased", "owners", "attempts", "first-failure",
                           "busy", "held"),
            args=[token, now_ms, len(delays), *delays, member]))

    def reschedule(self, kind: str, token: str, scores: dict[str, int], mark: str, since_ms: int) -> None:
        for shard, members in self.by_shard(scores).items():
            args = [value for member in members for value in (scores[member], member)]
            self.scripts["reschedule"](keys=self.keys(kind, shard, "pending", "leased", "owners", "busy", "held"),
                                       args=[token, mark, since_ms, *args])


@dataclass
class Shop:
    """The rows of the story, by the part each plays, and the moment 0.2 handed over (ms)."""

    t0_ms: int
    orders: dict[str, Any] = field(default_factory=dict)
    crowds: dict[str, list[Any]] = field(default_factory=dict)
    # Each order's deadline, in seconds from the hand-over.
    seconds: dict[Any, float] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name in ("orders", "crowds", "seconds"):
            raise AttributeError(name)
        return self.orders[name]

    def at(self, seconds: float) -> int:
        return self.t0_ms + round(1000 * seconds)

    def deadline_ms(self, order: Any) -> int:
        """Its deadline's score, as 0.2 wrote it (the deadline in ms, here whole)."""
        return self.at(self.seconds[order.pk])

    def closes(self) -> list[Any]:
        """The orders due and unpaid that a consumer must close, each once."""
        return [self.tod, self.tob, *self.crowds["batch"], self.busy, self.held_failed, *self.crowds["due"]]


# Each order's deadline, in seconds from the hand-over; every part is described where 0.2 writes it.
DEADLINES = {"tod": -80.5, "tob": -72.5, "held_failed": -58.5, "held_pending": -58.5, "retried": -57.5,
             "busy": -55.5, "paid_late": -19, "rem_leased": 575, "rem_pending": 650, "rem_paid": 650}
CROWDS = {"batch": (3, -60.5), "due": (2, -19), "future": (2, 3600)}


@pytest.fixture
def upgrade_settings(settings: Any, order_model: Any) -> None:
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": RETRY_DELAYS, "REMINDERS": REMINDERS,
                              "HOLD_CONDITION": Q(payments__state="pending")}


@pytest.fixture
def shop(upgrade_settings: None, order_model: Any, clock: Any, queue: Any) -> Shop:
    """The rows, each as the story leaves it in the database; Redis emptied of what today's
    saves wrote, for 0.2's writes alone."""
    clock.current = clock.current.replace(microsecond=clock.current.microsecond // 1000 * 1000)
    shop = Shop(t0_ms=round(clock.current.timestamp() * 1000))

    def order(seconds: float) -> Any:
        created = order_model.objects.create(expires_at=clock() + timedelta(seconds=seconds))
        shop.seconds[created.pk] = seconds
        return created

    shop.orders = {name: order(seconds) for name, seconds in DEADLINES.items()}
    shop.crowds = {name: [order(seconds) for _ in range(count)] for name, (count, seconds) in CROWDS.items()}
    payment = Payment if order_model is ShopOrder else OrderPayment
    payment.objects.create(order=shop.held_pending, state=PaymentState.PENDING)  # still in flight
    payment.objects.create(order=shop.held_failed, state=PaymentState.FAILED)  # failed since 0.2 held it
    for paid in (shop.paid_late, shop.rem_paid):
        set_state(paid, "paid")  # paid while 0.2's unschedule of its members did not reach Redis
    lose_redis_data(queue)
    return shop


def write_as_0_2(shop: Shop, old: Queue02) -> None:
    """0.2's saves, then its consumers, up to the hand-over (times in seconds before it).

    What they leave: leased, their consumers killed, the leases run out: ``tod`` (taken over once
    already), the three of ``batch``, the reminder of ``rem_leased``. Pending and due: ``tob``
    (taken over once, its row found locked: busy), ``busy``, ``retried`` (two attempts), the two
    held ones, ``due``, ``paid_late`` and the reminders of the hand-over's last minutes. Pending
    later: the rest. Each claim is checked to take what the story says, so the story is 0.2's.
    """
    at, member = shop.at, lambda order: str(order.pk)
    closes = {member(o): shop.deadline_ms(o) for o in [*shop.orders.values(), *sum(shop.crowds.values(), [])]}
    old.schedule(CLOSE, closes)
    # Reminders are due lead seconds before their deadline; those of orders long overdue went out under 0.2.
    unsent = [shop.rem_leased, shop.rem_pending, shop.rem_paid, *shop.crowds["future"]]
    reminders = {old.reminder(o.pk, lead): closes[member(o)] - round(1000 * lead) for o in unsent for lead in REMINDERS}
    reminders |= {old.reminder(o.pk, 60): closes[member(o)] - 60_000 for o in (*shop.crowds["due"], shop.paid_late)}
    old.schedule(REMIND, reminders)

    def claim(kind: str, seconds: float, *expected: Any, lead: float | None = None) -> dict[str, str]:
        claimed = old.claim_everywhere(kind, at(seconds))
        names = {member(o) if lead is None else old.reminder(o.pk, lead) for o in expected}
        assert set(claimed) == names, f"0.2's claim at {seconds} s took {sorted(claimed)}"
        return claimed

    def take_over(order: Any, seconds: float) -> str:
        token = old.token()
        taken, takeovers = old.claim(CLOSE, old.shard_of(member(order)), at(seconds), token)
        assert (taken, takeovers) == ([member(order)], 1), f"0.2's takeover at {seconds} s took {taken}"
        return token

    claim(CLOSE, -80, shop.tod)                         # killed holding it
    claim(REMIND, -80, shop.rem_leased, lead=660)       # the same consumer's reminders lane: killed too
    claim(CLOSE, -72, shop.tob)                         # killed holding it
    claim(CLOSE, -60, *shop.crowds["batch"])            # killed holding them (their leases end at -30)
    held = claim(CLOSE, -58, shop.held_failed, shop.held_pending)  # payments in flight: held
    for held_member, token in held.items():
        old.reschedule(CLOSE, token, {held_member: at(-58) + RECHECK_MS}, "held", at(-58))
    for attempt, seconds in enumerate((-57, -56), 1):  # its receiver raised twice: backed off 1 s, 2 s
        (token,) = claim(CLOSE, seconds, shop.retried).values()
        assert old.retry(CLOSE, token, member(shop.retried), at(seconds))[1] == attempt
    (token,) = claim(CLOSE, -55, shop.busy).values()    # its row locked by another transaction
    old.reschedule(CLOSE, token, {member(shop.busy): at(-55) + BUSY_RETRY_MS}, "busy", at(-55))
    take_over(shop.tod, -45)                            # taken over, and that consumer killed too
    token = take_over(shop.tob, -40)                    # taken over, its row locked
    old.reschedule(CLOSE, token, {member(shop.tob): at(-40) + BUSY_RETRY_MS}, "busy", at(-40))


class RecordingConsumer(Consumer):
    """Today's consumer, keeping each claim that took members (to see which came alone)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.claims: list[Claim] = []

    def claim(self, now: datetime, due_by: datetime | None = None) -> Claim:
        claim = super().claim(now, due_by)
        if claim.members:
            self.claims.append(claim)
        return claim

    def claims_of(self, member: str, kind: str = CLOSE) -> Iterator[Claim]:
        return (claim for claim in self.claims if claim.kind == kind and member in claim.members)


@pytest.fixture
def today(clock: Any) -> Callable[[], RecordingConsumer]:
    """Today's consumer on the test's clock, serving every kind (the upgraded shop's)."""
    return lambda: RecordingConsumer(now=clock, follow_database_clock=False)


@pytest.fixture
def failing_retried(receiver: Any, shop: Shop) -> list[Any]:
    """The retried order's receiver still raises (as it did under 0.2): calls recorded."""
    calls: list[Any] = []

    def stock_service_down(sender: Any, order: Any, **kwargs: Any) -> None:
        if order.pk == shop.retried.pk:
            calls.append(order.pk)
            raise RuntimeError(f"cannot release the stock of order {order.pk}")

    receiver(stock_service_down)
    return calls


def status() -> dict[str, Any]:
    out = io.StringIO()
    call_command("order_timeout_status", "--json", stdout=out)
    return json.loads(out.getvalue())


def pending_score(queue: Any, member: str, kind: str = CLOSE) -> int | None:
    own = queue if kind == CLOSE else queue.of_kind(kind)
    score = own.client.zscore(own.shard_for(member).keys.pending, member)
    return None if score is None else int(score)


def emails(order: Any) -> list[float]:
    return sorted(ReminderEmail.objects.filter(order_id=str(order.pk)).values_list("seconds_left", flat=True))


def test_the_copied_scripts_are_0_2s():
    for name, blob in BLOBS.items():
        text = (SCRIPTS / f"{name}.lua").read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest() == blob, name


@both_models
@both_redis
def test_a_queue_written_by_0_2_is_carried_on_by_todays_consumer(shop, queue, today, clock, failing_retried):
    old = Queue02(queue.client, queue.prefix, len(queue.shards))
    write_as_0_2(shop, old)

    before = status()
    worker = today()
    first = worker.run(once=True)
    clock.advance(RETRY_DELAYS[2])  # the retried one's last backoff
    worker.run(once=True)
    after = status()

    # 0.2's figures, read by today's status command as they were.
    assert {name: before[name] for name in ("pending", "due_unclaimed", "leased", "expired_leases", "busy",
                                            "taken_over", "held", "dead_letters", "overdue_unpaid_in_database",
                                            "drift", "reminders_pending", "reminders_due", "quarantined")} == {
        "pending": 13, "due_unclaimed": 8, "leased": 4, "expired_leases": 4, "busy": 2, "taken_over": 2,
        "held": 2, "dead_letters": 0, "overdue_unpaid_in_database": 10, "drift": 0, "reminders_pending": 12,
        "reminders_due": 5, "quarantined": 0}
    assert 54 <= before["oldest_due_age_seconds"] < 60
    # The kinds 0.2 did not have: their sections are there, and empty.
    assert before["timers"] and all(own["pending"] == own["leased"] == 0 for own in before["timers"].values())
    assert 55 <= before["oldest_busy_age_seconds"] < 61 and 58 <= before["oldest_held_age_seconds"] < 64

    # Every due unpaid order closed, once; the paid one not.
    assert {order.pk: expiries(order) for order in shop.closes()} == {order.pk: 1 for order in shop.closes()}
    assert state(shop.paid_late) == "paid" and expiries(shop.paid_late) == 0
    assert first.closed == len(shop.closes())
    # Each member 0.2 had taken over came alone: the one whose consumer died twice with its
    # count going on, the one found locked claimed by itself from pending. The batch 0.2's dead
    (tod,) = worker.claims_of(str(shop.tod.pk))
    assert (tod.members, tod.takeovers) == ([str(shop.tod.pk)], 2)
    (tob,) = worker.claims_of(str(shop.tob.pk))
    assert (tob.members, tob.takeovers) == ([str(shop.tob.pk)], 1)
    # consumer held is taken over as a batch (on each shard, the part it held there).
    crowd = [str(order.pk) for order in shop.crowds["batch"]]
    for member in crowd:
        (taken,) = worker.claims_of(member)
        on_its_shard = [other for other in crowd if queue.shard_for(other) is queue.shard_for(member)]
        assert (sorted(taken.members), taken.takeovers) == (sorted(on_its_shard), 1)

    # The retried one went on from 0.2's count: attempts 3 and 4 here, then its dead letter,
    # dated from 0.2's first failure.
    assert len(failing_retried) == 2 and state(shop.retried) == "unpaid"
    letter = DeadLetter.objects.get(order_id=str(shop.retried.pk))
    assert (letter.attempts, letter.timer, letter.resolved_at) == (4, "", None)
    assert letter.first_failed_at == datetime.fromtimestamp(shop.at(-57) / 1000, UTC)

    # Held still: looked at again HOLD_RECHECK after today's look, held since 0.2 first held it.
    assert state(shop.held_pending) == "unpaid" and expiries(shop.held_pending) == 0
    assert pending_score(queue, str(shop.held_pending.pk)) == shop.at(0) + RECHECK_MS
    member = str(shop.held_pending.pk)
    assert queue.client.zscore(queue.shard_for(member).keys.held, member) == shop.at(-58)

    # Reminders: each due one sent once (the one 0.2's dead consumer held, taken over); none for a
    # paid order or after its deadline; the later ones still waiting at 0.2's scores.
    assert (emails(shop.rem_leased), emails(shop.rem_pending)) == ([660.0], [660.0])
    assert not ReminderEmail.objects.exclude(order_id__in=[str(shop.rem_leased.pk), str(shop.rem_pending.pk)])
    assert Reminder.objects.filter(outcome=Reminder.Outcome.SENT).count() == 2
    (reminded,) = worker.claims_of(Queue02.reminder(shop.rem_leased.pk, 660), kind=REMIND)
    assert (len(reminded.members), reminded.takeovers) == (1, 1)
    for order in (*shop.crowds["future"], shop.rem_leased, shop.rem_pending, shop.rem_paid):
        deadline = shop.deadline_ms(order)
        assert pending_score(queue, str(order.pk)) == deadline
        for lead in REMINDERS:
            if deadline - 1000 * lead > shop.at(0):
                assert pending_score(queue, Queue02.reminder(order.pk, lead), REMIND) == deadline - 1000 * lead

    # Today's figures: nothing leased, busy or taken over left behind.
    assert {name: after[name] for name in ("pending", "due_unclaimed", "leased", "expired_leases", "busy",
                                           "taken_over", "held", "dead_letters", "overdue_unpaid_in_database",
                                           "drift", "reminders_pending", "reminders_due")} == {
        "pending": 6, "due_unclaimed": 0, "leased": 0, "expired_leases": 0, "busy": 0, "taken_over": 0,
        "held": 1, "dead_letters": 1, "overdue_unpaid_in_database": 1, "drift": 0, "reminders_pending": 7,
        "reminders_due": 0}
    for name in ("attempts", "first_failure", "takeovers", "busy"):
        assert sum(queue.client.hlen(getattr(s.keys, name)) if name != "busy" else queue.client.zcard(s.keys.busy)
                   for s in queue.shards) == 0, name

    # The scan finds nothing it must do; the rebuild, every future member where it belongs.
    scan = compensate(now=clock() + timedelta(seconds=200))
    assert (scan.examined, scan.closed, scan.held, scan.left_as_dead_letters, scan.failed) == (2, 0, 1, 1, 0)
    rebuild = compensate(rebuild=True)
    assert (rebuild.examined, rebuild.restored, rebuild.reminders_restored) == (4, 0, 0)


@both_models
def test_the_scan_on_a_queue_written_by_0_2_closes_what_no_consumer_took_and_the_consumer_the_rest(
        shop, queue, today, clock, failing_retried):
    """Consumers not started again for a while after the upgrade: the scan, long after 0.2's
    last moves, acts on every overdue row; the consumer then finds those settled."""
    write_as_0_2(shop, Queue02(queue.client, queue.prefix, len(queue.shards)))

    scan = compensate(now=clock() + timedelta(seconds=200))
    worker = today()
    stats = worker.run(once=True)
    # The scan's failure is backed off from the scan's time, as a consumer's would be.
    clock.advance(200 + RETRY_DELAYS[2])
    worker.run(once=True)

    closes = shop.closes()
    assert (scan.examined, scan.closed, scan.held, scan.failed) == (len(closes) + 2, len(closes), 1, 1)
    assert (scan.left_to_consumers, scan.missing_from_redis) == (0, 0)
    assert {order.pk: expiries(order) for order in closes} == {order.pk: 1 for order in closes}
    assert stats.closed == 0 and expiries(shop.paid_late) == 0
    # The scan's failed try counts as a consumer's would: 0.2's two, the scan's, the consumer's, its letter.
    assert len(failing_retried) == 2
    assert DeadLetter.objects.get(order_id=str(shop.retried.pk)).attempts == 4
    assert (emails(shop.rem_leased), emails(shop.rem_pending)) == ([660.0], [660.0])
    assert status()["pending"] == 6
