"""The fault scenarios: one function each, registered by ``@scenario``. Add one here, nowhere else.

A scenario gets a fresh ``Lab`` (empty tables, a fresh private Redis), starts
the processes it needs, creates orders, does its damage, heals it, and
returns a ``Story``: its cohorts, what each must come to, the bound each is
held to, and the moment the fault healed. The harness then counts the
invariants in the database (``chaos.invariants``).
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, connections, transaction
from django.db.models import Count, Max, Model

from order_timeout import get_order_model
from order_timeout.models import DeadLetter, Notice, QueueEpoch, Reminder
from order_timeout.scans.recovery import LOSSES, REBUILT

from . import bounds, invariants, kinds, orders, outage, queueview
from .beat import Beat
from .consumers import ConsumerPool
from .lab import Lab
from .models import Delivery, Payment, Role, Settlement, ShopMove, Stranded
from .processes import repeatedly
from .receivers import EXIT_STATUS
from .sink import REFUSED, Sink
from .story import Check, Cohort, Expect, KindCohort, Story
from .tuning import DEFAULT_LEASE_SECONDS

CONSUMERS = 4
# How long Redis or MariaDB stays down (or frozen) in the outage scenarios.
OUTAGE_SECONDS = 2.0
HUNG_SECONDS = 3.0
# How long Redis takes writes after its snapshot before it falls back to it (failover-lost-writes).
LOST_WRITES_SECONDS = 1.0


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    run: Callable[[Lab], Story]
    # Redis writes an append-only file (fsync always) in this scenario.
    aof: bool = False
    # Part of a plain run. The others reproduce a known failure of the app and are
    # run by name only (``--scenarios hang-forever``): they are expected to fail.
    default: bool = True


SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, title: str, *, aof: bool = False,
             default: bool = True) -> Callable[[Callable[[Lab], Story]], Callable[[Lab], Story]]:
    def register(run: Callable[[Lab], Story]) -> Callable[[Lab], Story]:
        SCENARIOS[name] = Scenario(name, title, run, aof, default)
        return run

    return register


def default_names() -> list[str]:
    return [name for name, scenario in SCENARIOS.items() if scenario.default]


def _third_of_the_way(lab: Lab, first: datetime, spread: float | None = None) -> datetime:
    """A moment a third into the deadlines: some orders are closed, most are still due."""
    return first + timedelta(seconds=(spread or lab.sizes.spread) / 3)


# -- no fault ----------------------------------------------------------------------------


@scenario("baseline", "no fault: the normal path, for comparison")
def baseline(lab: Lab) -> Story:
    with lab.consumers(CONSUMERS), lab.beat():
        lab.create_orders()
        return lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.normal(lab.tuning))]))


# -- consumers die or freeze ---------------------------------------------------------------


# The consumers and scans of the death scenarios run at the app's default lease, so that only
# the heartbeat can hand a dead consumer's batch over within their bound.
AT_THE_DEFAULT_LEASE = {"ORDER_TIMEOUT_LEASE_SECONDS": DEFAULT_LEASE_SECONDS}


@scenario("sigkill", "kill -9 a random consumer every ~1 s, restarted at once (as systemd would), at "
                     "the default LEASE_SECONDS (30 s)")
def sigkill_loop(lab: Lab) -> Story:
    # 2 ms per delivery (a receiver doing a query or two) keeps batches in hand long enough
    # for the kills to land in them. At 250 deadlines a second, not 400: with 2 ms a
    # delivery and a consumer or two always restarting, 400 a second ran the 2-vCPU
    # machine at capacity (batches of 50 taking 250 ms), where any death is a backlog.
    with (lab.consumers(CONSUMERS, CHAOS_DELIVERY_DELAY=0.002, **AT_THE_DEFAULT_LEASE) as pool,
          lab.beat(**AT_THE_DEFAULT_LEASE)):
        created = lab.create_orders(spread=1.6 * lab.sizes.spread)
        with repeatedly(1.0, pool.kill_one):
            lab.wait_until(lab.after(created.last_deadline, lab.tuning.lease_seconds))
        story = lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.death_found_by_heartbeat(lab.tuning))]))
    story.checks.append(Check("consumers were killed while deadlines passed", pool.kills > 0))
    story.facts["LEASE_SECONDS"] = DEFAULT_LEASE_SECONDS
    return story


@scenario("sigstop", "SIGSTOP consumers right after a claim, inside the closing transaction, and at "
                     "random moments; SIGCONT seconds later")
def sigstop(lab: Lab) -> Story:
    t = lab.tuning
    pauses = lab.logs / "pauses"
    pauses.mkdir(parents=True, exist_ok=True)
    # A consumer that froze itself stays frozen well past the moment its heartbeat is found gone
    # (and its session ended), though far inside its lease: only the heartbeat hands it over.
    found_dead = t.heartbeat_seconds * 4 / 3
    hold = found_dead + 1.5
    kinds = [Role.Behaviour.PAUSE_AFTER_CLAIM, Role.Behaviour.PAUSE_IN_CLOSE] * lab.sizes.misbehaving["pause"]
    with (lab.consumers(CONSUMERS, freeze_hold=hold, CHAOS_BEHAVIOURS=1, CHAOS_PAUSE_DIR=pauses,
                        **AT_THE_DEFAULT_LEASE) as pool,
          lab.beat(**AT_THE_DEFAULT_LEASE)):
        # Half a hold apart: at most two consumers freeze themselves at once, two stay awake.
        created = lab.create_orders(spread=max(lab.sizes.spread, (len(kinds) + 1) * hold / 2),
                                    spaced=(kinds, hold / 2))
        with repeatedly(2.0, lambda: pool.freeze_one(random.uniform(0.5, 2 * found_dead))):
            lab.wait_until(lab.after(created.last_deadline, t.lease_seconds))
        death = bounds.death_found_by_heartbeat(t)
        story = lab.settle(Story([Cohort("orders", Expect.CLOSED, death),
                                  Cohort(Role.Behaviour.PAUSE_AFTER_CLAIM, Expect.CLOSED, death),
                                  Cohort(Role.Behaviour.PAUSE_IN_CLOSE, Expect.CLOSED, death)]))
    paused = len(list(pauses.iterdir()))
    story.checks.append(Check("every chosen order froze its consumer once", paused == len(kinds),
                              f"{paused} pauses of {len(kinds)}"))
    story.facts["self-pauses (after claim, in close)"] = paused
    story.facts["LEASE_SECONDS"] = DEFAULT_LEASE_SECONDS
    return story


# -- Redis fails ------------------------------------------------------------------------------


@scenario("redis-aof", "Redis killed (SIGKILL) mid-run, restarted from its append-only file",
          aof=True)
def redis_aof(lab: Lab) -> Story:
    redis = lab.servers.redis
    return _server_down_a_while(lab, "Redis", redis.kill, lambda: redis.start(aof=True))


@scenario("redis-empty", "Redis killed and restarted empty (no persistence): healed by the scan "
                         "and --rebuild")
def redis_empty(lab: Lab) -> Story:
    t = lab.tuning
    # Deadlines long enough after the loss that some are put back by --rebuild before they fall due.
    spread = lab.sizes.spread + 2 * t.compensation_interval
    with lab.consumers(CONSUMERS), lab.beat(rebuild=True) as beat:
        created = lab.create_orders(spread=spread, cohort="due before --rebuild")
        healed, came_back_empty = _empty_redis_a_third_of_the_way(lab, created.first_deadline)
        rebuilt_at = _first_rebuild_after(beat, healed, timeout=3 * t.compensation_interval)
        restored = []
        if rebuilt_at is not None:
            # Due after the rebuild put them back: the consumers close them on time.
            margin = rebuilt_at + timedelta(seconds=0.5)
            restored = list(get_order_model()._base_manager.filter(
                pk__in=created.ids, expires_at__gt=margin).values_list("pk", flat=True))
            orders.assign(restored, "put back by --rebuild")
        story = lab.settle(Story([
            Cohort("due before --rebuild", Expect.CLOSED, bounds.redis_lost(t)),
            Cohort("put back by --rebuild", Expect.CLOSED, bounds.normal(t)),
        ], heal_at=healed))
    story.checks += [
        Check("Redis came back empty", came_back_empty),
        Check("--rebuild ran after the loss", rebuilt_at is not None),
    ]
    return story


@scenario("redis-empty-no-beat", "Redis killed and restarted empty mid-burst, no Celery beat: a "
                                 "consumer finds the queue's epoch gone and rebuilds it")
def redis_empty_no_beat(lab: Lab) -> Story:
    t = lab.tuning
    with lab.consumers(CONSUMERS):
        created = lab.create_orders(spread=lab.sizes.spread, cohort="rebuilt by a consumer")
        healed, came_back_empty = _empty_redis_a_third_of_the_way(lab, created.first_deadline)
        story = lab.settle(Story([
            Cohort("rebuilt by a consumer", Expect.CLOSED, bounds.redis_emptied(t, OUTAGE_SECONDS / 2)),
        ], heal_at=healed))
    story.checks += [Check("Redis came back empty", came_back_empty)]
    return story


@scenario("housekeeping", "no beat, no cron: a burst, and orders whose members never reached Redis; the "
                          "consumer running the scan SIGKILLed mid-scan, restarted; the others take it over")
def housekeeping(lab: Lab) -> Story:
    t = lab.tuning
    # 20 ms a delivery: the scan's chunk of lost orders takes long enough to be killed in.
    with lab.consumers(CONSUMERS, CHAOS_DELIVERY_DELAY=0.02) as pool:
        created = lab.create_orders(cohort="orders")
        lost = lab.create_orders(count=max(40, lab.sizes.orders // 10), lead=0.5, spread=1.0,
                                 cohort="lost alone, no beat")
        queueview.lose_alone(lost.ids)
        healed = lab.now()
        killed: list[int] = []
        deadline = time.monotonic() + t.compensation_grace + 2 * t.compensation_interval + 10
        while not killed and time.monotonic() < deadline:
            runner = queueview.scan_runner()
            if runner is not None and runner in pool.pids() and pool.kill_pid(runner):
                killed.append(runner)
            time.sleep(0.05)
        lab.wait_until(lab.after(created.last_deadline, 1.0))
        story = lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.normal(t)),
                                  Cohort("lost alone, no beat", Expect.CLOSED, bounds.lost_with_no_beat(t))],
                                 heal_at=healed))
    story.checks.append(Check("the consumer running the scan was killed mid-scan", bool(killed),
                              f"pid {killed[0]}" if killed else "no scan was seen running"))
    story.facts["scan runners killed"] = len(killed)
    return story


@scenario("failover-lost-writes", "Redis falls back to a copy from before its last second of writes "
                                  "mid-burst (killed, started from its last snapshot, as a replica that "
                                  "missed them is promoted), no Celery beat: a consumer finds the "
                                  "queue's epoch stamped by another server and rebuilds it")
def failover_lost_writes(lab: Lab) -> Story:
    t, redis = lab.tuning, lab.servers.redis
    with lab.consumers(CONSUMERS):
        created = lab.create_orders(spread=lab.sizes.spread, cohort="queued before the snapshot")
        lab.wait_until(_third_of_the_way(lab, created.first_deadline))
        queueview.snapshot()
        # The writes the copy misses: these orders' deadlines, and the claims and acks meanwhile.
        missed = lab.create_orders(count=max(20, lab.sizes.orders // 10), lead=2.0, spread=1.0,
                                   cohort="written after the snapshot")
        time.sleep(LOST_WRITES_SECONDS)
        redis.kill()
        time.sleep(OUTAGE_SECONDS / 2)
        redis.start()
        healed = lab.now()
        # Counted at once, though a consumer may have rebuilt the queue already (a cluster's nodes
        # serve their slots one by one): what its rebuild put back was missing too.
        lost = len(missed.ids) - len(queueview.present_among(queueview.member_of(pk) for pk in missed.ids))
        bound = bounds.redis_emptied(t, OUTAGE_SECONDS / 2)
        story = lab.settle(Story([Cohort("queued before the snapshot", Expect.CLOSED, bound),
                                  Cohort("written after the snapshot", Expect.CLOSED, bound)],
                                 heal_at=healed))
    rebuilt = sum(QueueEpoch.objects.values_list("rebuilds", flat=True))
    # What the consumer that rebuilt it said: the marker was there, written by another server.
    logs = [log.read_text(errors="replace") for log in lab.logs.glob("consumer-*.log")]
    told = sum(log.count(LOSSES["moved"]) for log in logs)
    put_back = sum(int(found) for log in logs for found in re.findall(_REBUILT_COUNT, log))
    story.checks += [
        Check("Redis came back without writes made after its snapshot", lost > 0 or put_back > 0,
              f"{lost} of {len(missed.ids)} deadlines missing as it answered, {put_back} put back by "
              "the rebuild"),
        Check("a consumer rebuilt the queue", rebuilt > 0, f"{rebuilt} rebuilds"),
        Check("it logged that another server holds the marker (not that the marker is gone)", told > 0,
              f"{told} such log lines"),
    ]
    story.facts["deadlines missing as Redis answered again"] = lost
    story.facts["members put back by the rebuild"] = put_back
    return story


# The number in a consumer's log line that says what its rebuild put back.
_REBUILT_COUNT = re.escape(REBUILT).replace(re.escape("%d"), r"(\d+)")


def _empty_redis_a_third_of_the_way(lab: Lab, first_deadline: datetime) -> tuple[datetime, bool]:
    """Kill Redis (no persistence) a third of the way through the deadlines and start it again
    empty; returns when it answered again, and whether it came back with nothing queued."""
    redis = lab.servers.redis
    lab.wait_until(_third_of_the_way(lab, first_deadline, lab.sizes.spread))
    queueview.mark_every_shard()
    redis.kill()
    time.sleep(OUTAGE_SECONDS / 2)
    redis.start()
    # Not "nothing queued": a consumer's rebuild may have refilled the queue by the time it is asked
    # (seen on a Redis Cluster, whose start waits for every node: "Redis came back empty" failed).
    return lab.now(), queueview.marks_left() == 0


def _first_rebuild_after(beat: object, moment: datetime, timeout: float) -> datetime | None:
    """When the first successful ``--rebuild`` that started after ``moment`` ended."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        for scan in list(beat.scans):  # type: ignore[attr-defined]
            if "--rebuild" in scan.command and scan.status == 0 and scan.started_at > moment:
                return scan.ended_at
        time.sleep(0.1)
    return None


@scenario("redis-hung", "Redis frozen (SIGSTOP) while orders are saved one by one; SIGCONT later")
def redis_hung(lab: Lab) -> Story:
    t, redis, sizes = lab.tuning, lab.servers.redis, lab.sizes
    per_second = max(50.0, sizes.orders / 20)
    with lab.consumers(CONSUMERS), lab.beat():
        lab.create_orders(spread=sizes.spread + HUNG_SECONDS, cohort="created in bulk before")
        with orders.OneByOne(4, per_second, sizes.lead, sizes.spread, "saved one by one") as saving:
            time.sleep(1.0)
            frozen = lab.now()
            redis.freeze()
            time.sleep(HUNG_SECONDS)
            redis.thaw()
            healed = lab.now()
            time.sleep(1.0)
        saves = saving.saves
        during = [save for save in saves if save.began <= healed and save.ended >= frozen]
        orders.assign([save.pk for save in during if save.pk is not None], "saved while Redis hung")
        outage = bounds.outage(t, (healed - frozen).total_seconds())
        story = lab.settle(Story([
            Cohort("created in bulk before", Expect.CLOSED, outage),
            Cohort("saved one by one", Expect.CLOSED, outage),
            Cohort("saved while Redis hung", Expect.CLOSED, bounds.redis_lost(t)),
        ], heal_at=healed))
    failed = [save for save in saves if save.error]
    slowest = max((save.seconds for save in during), default=0.0)
    # A hung Redis may cost a save about three SCHEDULE_TIMEOUTs (docs/settings.md), plus the insert.
    allowed = 3 * t.schedule_timeout + 0.5
    story.checks += [
        Check("every save went through while Redis hung", not failed,
              "; ".join(save.error for save in failed[:3])),
        Check(f"no save took longer than 3 x SCHEDULE_TIMEOUT + 0.5 s ({allowed:.1f} s)",
              slowest <= allowed, f"slowest save {slowest:.2f} s"),
        Check("orders were saved while Redis hung", bool(during)),
    ]
    story.facts.update({"saves while hung": len(during), "slowest save while hung (s)": round(slowest, 3)})
    return story


# -- MariaDB fails ---------------------------------------------------------------------------


@scenario("mariadb-kill", "MariaDB killed (kill -9) mid-run and restarted (InnoDB recovery)")
def mariadb_kill(lab: Lab) -> Story:
    mariadb = lab.servers.mariadb

    def kill() -> None:
        mariadb.kill()
        connections.close_all()  # the harness's own, dead with the server

    return _server_down_a_while(lab, "MariaDB", kill, mariadb.start)


def _server_down_a_while(lab: Lab, name: str, kill: Callable[[], None],
                         start: Callable[[], None]) -> Story:
    """A third into the deadlines, ``kill`` a server; ``start`` it OUTAGE_SECONDS later."""
    with lab.consumers(CONSUMERS), lab.beat():
        created = lab.create_orders()
        lab.wait_until(_third_of_the_way(lab, created.first_deadline))
        killed = lab.now()
        kill()
        time.sleep(OUTAGE_SECONDS)
        start()
        healed = lab.now()
        outage = (healed - killed).total_seconds()
        return lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.outage(lab.tuning, outage))],
                                heal_at=healed, facts={f"{name} down (s)": round(outage, 1)}))


# -- the shop races, misbehaves, deletes ------------------------------------------------------------


@scenario("payments", "payments racing the deadline: mark_paid() from 8 threads around each deadline")
def payments(lab: Lab) -> Story:
    with lab.consumers(CONSUMERS), lab.beat():
        created = lab.create_orders(lead=lab.sizes.lead + 1, cohort="never paid")
        due = dict(get_order_model()._base_manager.filter(pk__in=created.ids)
                   .values_list("pk", "expires_at"))
        chosen = random.sample(created.ids, len(created.ids) // 2)
        early, racing = chosen[: len(chosen) // 3], chosen[len(chosen) // 3:]
        orders.assign(early, "paid early")
        orders.assign(racing, "paid at the deadline")
        plan = {pk: due[pk] - timedelta(seconds=random.uniform(0.3, 1.0)) for pk in early}
        plan |= {pk: due[pk] + timedelta(seconds=random.uniform(-0.1, 0.05)) for pk in racing}
        orders.pay_at(plan, threads=8)
        normal = bounds.normal(lab.tuning)
        story = lab.settle(Story([Cohort("never paid", Expect.CLOSED, normal),
                                  Cohort("paid early", Expect.PAID_OR_CLOSED, normal),
                                  Cohort("paid at the deadline", Expect.PAID_OR_CLOSED, normal)]))
    answers = dict(Payment.objects.values_list("outcome").annotate(count=Count("order_id")))
    answered = dict(Payment.objects.values_list("order_id", "answered_at"))
    lag = max(((answered[pk] - moment).total_seconds() for pk, moment in plan.items()), default=0.0)
    story.facts.update({"payments that won": answers.get(Payment.Outcome.PAID, 0),
                        "payments refused (refund)": answers.get(Payment.Outcome.REFUND, 0),
                        "latest answer after its planned moment (s)": round(lag, 2)})
    return story


# -- staff pause the close while the payment provider is down ----------------------------------

DUE_BEFORE_PAUSE = "due before the pause"
DUE_IN_PAUSE = "due in the pause (given back)"
# Role.cohort holds 40 characters.
DUE_AFTER_RESUME = "due after the resume, within the grace"
PAID_WHILE_PAUSED = "paid while paused"
PAID_IN_TIME_GIVEN_BACK = "paid in the time given back"


@scenario("pause", "staff pause the close mid-burst (a payment provider down), a consumer SIGKILLed and restarted "
                   "during the pause, payments accepted meanwhile; resumed with --give-back")
def pause(lab: Lab) -> Story:
    """docs/operations.md's runbook, played against a burst: ``order_timeout_pause`` a third of the
    way through the deadlines; once the pause has reached every consumer, consumer 0 SIGKILLed (its
    supervisor starts it again: it must stay paused) and a fifth of the orders already due paid (each
    payment accepted); paused until a beat's scan has met orders overdue past COMPENSATION_GRACE
    (and left them alone), so several heartbeats; then ``order_timeout_resume --give-back``. A third
    of the orders given the time back whose old deadline had passed are paid in that time, before
    their new deadline (each payment accepted: without the give-back they were closed at the resume).
    A full run's deadlines go on past the resume: those within GIVE_BACK_GRACE are given the time too.
    """
    t = lab.tuning
    reach = outage.reach(t)
    with (lab.consumers(CONSUMERS) as pool, lab.beat() as beat,
          outage.staff("PSP outage: 3-D Secure failing (the fault run)") as staff):
        created = lab.create_orders(cohort=DUE_IN_PAUSE)
        before = _deadlines(created.ids)
        lab.wait_until(_third_of_the_way(lab, created.first_deadline))
        paused = staff.pause_close()
        orders.assign([pk for pk, due in before.items() if due < paused.paused_at], DUE_BEFORE_PAUSE)
        assert staff.paused_by_db is not None
        lab.wait_until(lab.after(staff.paused_by_db, reach.seconds))
        restarted, stayed_paused = outage.kill_and_see_it_paused(pool, lab.logs)
        model = get_order_model()
        waiting = dict(model._base_manager.filter(model.unpaid_q(), pk__in=created.ids, expires_at__lte=lab.now())
                       .values_list("pk", "expires_at"))
        paying = random.sample(sorted(waiting), len(waiting) // 5)
        orders.assign(paying, PAID_WHILE_PAUSED)
        outage.pay_now(paying)
        # Overdue past the scan's grace: a scan that started then would close them, were they not paused.
        overdue_for_the_scan = lab.after(min(waiting.values(), default=lab.now()), t.compensation_grace)
        scanned = beat.scanned_since(overdue_for_the_scan, timeout=t.compensation_interval + 30)
        still_open = model._base_manager.filter(model.unpaid_q(), pk__in=created.ids).values_list("pk", flat=True)
        members = [queueview.member_of(pk) for pk in still_open]
        in_redis = queueview.present_among(members)
        letters = DeadLetter.objects.count()
        resumed = staff.resume_close(give_back=True)
        assert staff.resumed_at is not None and resumed.resumed_at is not None
        after = _deadlines(created.ids)
        given_back = [pk for pk in created.ids if after[pk] != before[pk] and before[pk] < resumed.resumed_at
                      and after[pk] >= lab.after(staff.resumed_at, 1.0)]
        in_time = random.sample(given_back, len(given_back) // 3)
        orders.assign(in_time, PAID_IN_TIME_GIVEN_BACK)
        later = [pk for pk in created.ids if before[pk] >= resumed.resumed_at]
        orders.assign(later, DUE_AFTER_RESUME)
        orders.pay_at({pk: after[pk] - timedelta(seconds=random.uniform(0.3, 0.8)) for pk in in_time}, threads=4)
        back = outage.resumed(t)
        story = lab.settle(Story([Cohort(DUE_BEFORE_PAUSE, Expect.CLOSED, back),
                                  Cohort(DUE_IN_PAUSE, Expect.CLOSED, back),
                                  *([Cohort(DUE_AFTER_RESUME, Expect.CLOSED, back)] if later else []),
                                  Cohort(PAID_WHILE_PAUSED, Expect.PAID, None),
                                  # A payment the harness makes late, past the new deadline, may meet the close.
                                  Cohort(PAID_IN_TIME_GIVEN_BACK, Expect.PAID_OR_CLOSED, back)],
                                 heal_at=staff.resumed_at))
        scans = [scan for scan in beat.scans if overdue_for_the_scan < scan.started_at and scan.ended_at
                 < staff.resumed_at]
    checks, facts = outage.pause_checks(staff, before, set(paying), t)
    accepted = Payment.objects.filter(order_id__in=in_time, outcome=Payment.Outcome.PAID).count()
    story.checks += [
        *checks,
        Check("the consumer SIGKILLed during the pause came back and stayed paused", restarted and stayed_paused,
              "not restarted" if not restarted else f"its log since its start lacks {outage.PAUSED_HERE!r}"),
        Check("a scan ran while paused, past COMPENSATION_GRACE of the waiting orders, and left them alone",
              scanned and bool(scans), f"{len(scans)} scans started after {overdue_for_the_scan:%H:%M:%S.%f} "
                                       "and ended before the resume"),
        Check("every order waiting for the resume kept its member in Redis", len(in_redis) == len(members),
              f"{len(members) - len(in_redis)} of {len(members)} missing"),
        Check("nothing dead-lettered while paused", letters == 0, f"{letters} dead letters"),
        Check("orders were due while paused, and paid then", bool(waiting) and bool(paying),
              f"{len(waiting)} due and waiting, {len(paying)} paid"),
        Check("a payment in the time given back was accepted", accepted > 0,
              f"{accepted} of {len(in_time)}"),
    ]
    story.facts.update({**facts, "waiting when the pause had reached every consumer": len(waiting),
                        "payments accepted while paused": Payment.objects.filter(
                            order_id__in=paying, outcome=Payment.Outcome.PAID).count(),
                        "payments in the time given back (accepted)": f"{len(in_time)} ({accepted})",
                        "scans while paused past the grace": len(scans)})
    return story


# -- payments take time: holds and reminders ---------------------------------------------------

NO_PAYMENT = "no payment"
SUCCEEDED = "payment succeeded"
FAILED = "payment failed"
PENDING = "payment still pending"


@scenario("held-payments", "payments in flight at the deadline hold their orders; confirmed, failed or still "
                           "pending around and after it, while a consumer is killed every ~1 s")
def held_payments(lab: Lab) -> Story:
    """Orders with a pending payment (HOLD_CONDITION) are held, not closed, at their deadline.

    From 0.5 s before to 2.5 s after each deadline the gateway's webhook
    settles some payments: succeeded (the order is paid in the same
    transaction: ``mark_paid()`` must say True) or failed (the order must
    close at the next look, HOLD_RECHECK later); the rest stay pending to the
    end, held past COMPENSATION_GRACE so that the scan meets them too.
    """
    t, sizes = lab.tuning, lab.sizes
    # Every held order is looked at again every HOLD_RECHECK (1 s), mostly a few at a time:
    # the 200 still pending at the end of a full run (20 in a quick one) are 200 more looks
    # a second on top of 200 deadlines a second, with a consumer restarting every second.
    # With 1,000 of them (3,000 more settling) at 250 deadlines a second, the 2-core machine ran
    # at capacity: orders without a payment closed 3.5 s late at p99.
    in_flight = {SUCCEEDED: sizes.count(0.1), FAILED: sizes.count(0.1), PENDING: sizes.count(0.02, at_least=20)}
    with (lab.payment_settings(holds=True) as env,
          lab.consumers(CONSUMERS, CHAOS_DELIVERY_DELAY=0.002, **env) as pool, lab.beat(**env) as beat):
        created = lab.create_orders(spread=2 * sizes.spread, cohort=NO_PAYMENT, in_flight=in_flight)
        due = _deadlines(created.ids)
        cohort_of = dict(Role.objects.filter(cohort__in=in_flight).values_list("order_id", "cohort"))
        states = {SUCCEEDED: Settlement.State.SUCCEEDED, FAILED: Settlement.State.FAILED}
        plan = {pk: (due[pk] + timedelta(seconds=random.uniform(-0.5, 2.5)), states[cohort])
                for pk, cohort in cohort_of.items() if cohort in states}
        pending = sorted(pk for pk, cohort in cohort_of.items() if cohort == PENDING)
        # Held past COMPENSATION_GRACE, so that scans meet them (and must leave them open).
        first_held = min(due[pk] for pk in pending)
        met_by_scan = lab.after(first_held, t.compensation_grace)
        until = max(lab.after(max(moment for moment, _ in plan.values()), t.hold_recheck + t.lease_seconds),
                    lab.after(met_by_scan, t.compensation_interval + 1))
        with repeatedly(1.0, pool.kill_one):
            orders.settle_at(plan, threads=8)
            lab.wait_until(until)
            beat.scanned_since(met_by_scan, timeout=t.compensation_interval + 30)
        story = lab.settle(Story([
            Cohort(NO_PAYMENT, Expect.CLOSED, bounds.consumer_death(t)),
            Cohort(SUCCEEDED, Expect.PAID, None),
            Cohort(FAILED, Expect.CLOSED, bounds.hold_released(t)),
            Cohort(PENDING, Expect.HELD, None),
        ], held=pending))
        queued = queueview.present_among(queueview.member_of(pk) for pk in pending)
        scans = [scan for scan in beat.scans if scan.started_at > met_by_scan and scan.status == 0]
    story.checks += invariants.held_payment_checks(orders.payment_model())
    story.checks += [
        Check("every order still held is in Redis, to be looked at again", len(queued) == len(pending),
              f"{len(pending) - len(queued)} of {len(pending)} held orders are not"),
        Check("consumers were killed while payments settled", pool.kills > 0),
        Check("a scan ran while orders were held past COMPENSATION_GRACE", bool(scans)),
    ]
    settled_late = sum(1 for pk, (moment, _) in plan.items() if moment > due[pk])
    story.facts.update({"payments settled after their deadline (held until then)": settled_late,
                        "scans that met held orders": len(scans)})
    return story


PAID_BEFORE = "paid before its reminders"
PAID_BETWEEN = "paid between its reminders"
PAID_AS_DUE = "paid as a reminder fell due"
NEVER_PAID = "never paid"


@scenario("reminders", "reminders before each deadline; orders paid before, between or as they fall due, "
                       "while a consumer is killed every ~1 s")
def reminders(lab: Lab) -> Story:
    """REMINDERS (6 s and 1 s before the deadline) under the sigkill loop.

    Half the orders are paid by 8 threads: before the first reminder's moment,
    between the two, or within 0.1 s of either moment (racing it); the rest
    are never paid and close. Right after each kill the harness notes the
    reminders under lease (``Stranded``): a 1 s reminder whose consumer died
    holding it is taken over after its deadline and dropped, by design.
    """
    t, sizes = lab.tuning, lab.sizes
    leads = sorted(t.reminders, reverse=True)
    first, last = leads[0], leads[-1]
    death = bounds.consumer_death(t)
    with (lab.payment_settings(reminders=True) as env,
          lab.consumers(CONSUMERS, CHAOS_DELIVERY_DELAY=0.002, **env) as pool, lab.beat(**env)):
        # Half the orders, at 100 deadlines a second in a full run: an order never paid costs
        # three deliveries (two reminders and its close), one paid between its reminders one,
        # so about 190 deliveries a second, fewer than `sigkill`'s 250. With every order at
        # 250 a second (about 480 deliveries), the 2-core machine ran at capacity: closes
        # 11.6 s late, 95 six-second reminders more than 6 s late, and so dropped. The
        # earliest is created a second and more before its first reminder's moment.
        created = lab.create_orders(sizes.orders // 2, spread=2 * sizes.spread, lead=sizes.lead + first + 1,
                                    cohort=NEVER_PAID)
        due = _deadlines(created.ids)
        paid = random.sample(created.ids, len(created.ids) // 2)
        before, between, as_due = paid[0::3], paid[1::3], paid[2::3]
        for cohort, ids in ((PAID_BEFORE, before), (PAID_BETWEEN, between), (PAID_AS_DUE, as_due)):
            orders.assign(ids, cohort)
        second = timedelta(seconds=1)
        plan = {pk: due[pk] - second * (first + random.uniform(0.3, 1.0)) for pk in before}
        plan |= {pk: due[pk] - second * random.uniform(last + 0.3, first - 0.3) for pk in between}
        plan |= {pk: due[pk] - second * (random.choice(leads) + random.uniform(-0.1, 0.1)) for pk in as_due}
        stranded: list[Stranded] = []
        with repeatedly(1.0, _kill_noting_reminders(lab, pool, due, leads, stranded)):
            orders.pay_at(plan, threads=8)
            lab.wait_until(lab.after(created.last_deadline, t.lease_seconds))
        Stranded.objects.bulk_create(stranded, batch_size=orders.CHUNK)
        story = lab.settle(Story([Cohort(NEVER_PAID, Expect.CLOSED, death),
                                  Cohort(PAID_BEFORE, Expect.PAID_OR_CLOSED, death),
                                  Cohort(PAID_BETWEEN, Expect.PAID_OR_CLOSED, death),
                                  Cohort(PAID_AS_DUE, Expect.PAID_OR_CLOSED, death)]))
    checks, facts = invariants.reminder_checks([round(1000 * lead) for lead in leads], death.total(0.0))
    story.checks += [*checks, Check("consumers were killed while reminders fell due", pool.kills > 0)]
    outcomes = dict(Reminder.objects.values_list("outcome").annotate(count=Count("id")))
    answers = dict(Payment.objects.values_list("outcome").annotate(count=Count("order_id")))
    story.facts.update({**facts, "reminders recorded (sent, held, failed)": ", ".join(
        str(outcomes.get(outcome, 0)) for outcome in Reminder.Outcome),
        "payments refused (refund)": answers.get(Payment.Outcome.REFUND, 0),
        "leased reminders noted at kills": len(stranded)})
    return story


def _kill_noting_reminders(lab: Lab, pool: ConsumerPool, due: dict[int, datetime], leads: list[float],
                           stranded: list[Stranded]) -> Callable[[], None]:
    """Kill a consumer, and note right after the reminders under lease (``Stranded``): a short one
    whose consumer died holding it is taken over after its deadline and dropped, by design."""

    def kill_and_note() -> None:
        kills = pool.kills
        pool.kill_one()
        if pool.kills == kills:
            return
        killed_at = lab.now()
        for pk, lead in queueview.leased_reminders(_reminders_near(due, leads, killed_at, lab.tuning.lease_seconds)):
            stranded.append(Stranded(order_id=pk, lead_ms=lead, killed_at=killed_at))

    return kill_and_note


def _reminders_near(due: dict[int, datetime], leads: list[float], moment: datetime,
                    lease: float) -> list[tuple[int, int]]:
    """The reminders, ``(pk, lead_ms)``, a consumer may hold at ``moment``: fallen due by then,
    their deadline no more than a lease and a second before it."""
    soon, since = moment + timedelta(seconds=0.1), moment - timedelta(seconds=lease + 1)
    return [(pk, round(1000 * lead)) for pk, deadline in due.items() for lead in leads
            if deadline - timedelta(seconds=lead) <= soon and deadline >= since]


# -- every kind of timer at once ------------------------------------------------------------

LAPSES = "lapses"
HELD_COMPLETED = "held, then completed"
HELD_ABANDONED = "held, then abandoned"
COMPLETES = "completes"
RETURNED = "return opened"
PLAIN_NEVER_PAID = "never paid"
PLAIN_PAID_EARLY = "paid before its deadline"
PLAIN_PAID_AT = "paid at its deadline"
PLAIN_PAID_LATE = "paid once cancelled"
# Seconds before (or after) the deadline at which the shop makes its moves.
BEFORE = (0.5, 1.5)
AFTER = (0.2, 2.5)
# set_deadline() calls a second the harness counts on (4 threads), to give every PlainOrder its
# deadline before the first falls due.
DEADLINES_PER_SECOND = 400


@scenario("every-kind", "the order close, reminders, stock reservations lapsing, delivered orders completing and "
                        "PlainOrder payment deadlines, all falling due while a consumer is killed every ~1 s")
def every_kind(lab: Lab) -> Story:
    """Every kind of timer the test project has, at once, under the sigkill loop.

    A quarter of the run's rows each, their deadlines mixed over the same seconds:

    - orders with ``REMINDERS`` (6 s and 1 s, as in ``reminders``): half never paid, half paid
      by a thread between their two reminders;
    - stock reservations (``reservation-lapses``): a tenth whose checkout starts completing
      0.5-1.5 s before the deadline and completes 0.2-2.5 s after it (held meanwhile: never
      released), a tenth whose checkout is abandoned then (released at the next look); the
      rest lapse, their stock back;
    - delivered orders (``complete-after-delivery``): a fifth with a return opened 0.5-1.5 s
      before the deadline (never completed); the rest complete, one status change each;
    - PlainOrders (``plain-order-payment``, deadlines in the app's table through
      ``set_deadline()``): a fifth paid 0.5-1.5 s before the deadline, a tenth within 0.1 s of
      it (paid or cancelled, never both), a tenth paid once cancelled, one to two bounds after
      the deadline (refused with ``OrderClosed``); the rest cancelled.

    A move meant for before a deadline that the harness makes after it (behind its plan on a
    busy machine) may meet the row acted on: such rows are judged "one or the other, not both".
    """
    t, sizes = lab.tuning, lab.sizes
    leads = sorted(t.reminders, reverse=True)
    first, last = leads[0], leads[-1]
    death = bounds.consumer_death(t)
    share, spread = sizes.orders // 4, 2 * sizes.spread
    tenth, fifth = max(1, share // 10), max(1, share // 5)
    with (lab.payment_settings(reminders=True) as env,
          lab.consumers(CONSUMERS, CHAOS_DELIVERY_DELAY=0.002, **env) as pool, lab.beat(**env)):
        began = lab.now()
        # The earliest deadline once every row has one, and its first reminder's moment still ahead.
        start = began + timedelta(seconds=sizes.lead + first + 1 + share / DEADLINES_PER_SECOND)
        plain = kinds.create_plain_orders(_spread_from(start, share, spread), {
            PLAIN_NEVER_PAID: 0, PLAIN_PAID_EARLY: fifth, PLAIN_PAID_AT: tenth, PLAIN_PAID_LATE: tenth})
        reservations = kinds.create_reservations(_spread_from(start, share, spread), {
            LAPSES: 0, HELD_COMPLETED: tenth, HELD_ABANDONED: tenth})
        deliveries = kinds.create_deliveries(_spread_from(start, share, spread), {COMPLETES: 0, RETURNED: fifth})
        created = lab.create_orders(share, spread=spread, lead=(start - lab.now()).total_seconds(),
                                    cohort=NEVER_PAID)
        ready = lab.now()
        due = _deadlines(created.ids)
        paying = random.sample(created.ids, len(created.ids) // 2)
        orders.assign(paying, PAID_BETWEEN)
        second = timedelta(seconds=1)
        payments = {pk: due[pk] - second * random.uniform(last + 0.3, first - 0.3) for pk in paying}

        def before(moment: datetime) -> datetime:
            return moment - second * random.uniform(*BEFORE)

        def after(moment: datetime) -> datetime:
            return moment + second * random.uniform(*AFTER)

        moves = [
            *((before(at), kinds.start_completing, pk) for cohort in (HELD_COMPLETED, HELD_ABANDONED)
              for pk, at in reservations.of(cohort).items()),
            *((after(at), kinds.complete, pk) for pk, at in reservations.of(HELD_COMPLETED).items()),
            *((after(at), kinds.abandon, pk) for pk, at in reservations.of(HELD_ABANDONED).items()),
            *((before(at), kinds.open_return, pk) for pk, at in deliveries.of(RETURNED).items()),
            *((before(at), kinds.pay_plain_order, pk) for pk, at in plain.of(PLAIN_PAID_EARLY).items()),
            *((at + second * random.uniform(-0.1, 0.1), kinds.pay_plain_order, pk)
              for pk, at in plain.of(PLAIN_PAID_AT).items()),
        ]
        # Paid once cancelled: after the bound, and then only once the order is cancelled (in threads
        # of their own, as each may wait for it).
        once_cancelled = [(at + second * random.uniform(1, 2) * death.total(0.0), kinds.pay_once_cancelled, pk)
                          for pk, at in plain.of(PLAIN_PAID_LATE).items()]
        stranded: list[Stranded] = []
        with repeatedly(1.0, _kill_noting_reminders(lab, pool, due, leads, stranded)):
            kinds.alongside(lambda: orders.pay_at(payments, threads=4), lambda: kinds.at_moments(moves, threads=6),
                            lambda: kinds.at_moments(once_cancelled, threads=2))
            lab.wait_until(lab.after(max(created.last_deadline, start + timedelta(seconds=spread)),
                                     t.lease_seconds))
        Stranded.objects.bulk_create(stranded, batch_size=orders.CHUNK)
        # A move meant for before the deadline that came after it (the harness behind its plan on a
        # busy machine) may find the row acted on: those rows are judged "one or the other".
        late = {(timer, cohort, either): kinds.count_late_moves(timer, cohort, f"{cohort}, its move late")
                for timer, cohort, either in ((kinds.RESERVATIONS, HELD_COMPLETED, "used or released"),
                                              (kinds.COMPLETIONS, RETURNED, "returned or completed"),
                                              (kinds.PLAIN_PAYMENT, PLAIN_PAID_EARLY, "paid or cancelled"))}
        late_moves = [KindCohort(timer, f"{cohort}, its move late", None, f"{either}, not both", death)
                      for (timer, cohort, either), count in late.items() if count]
        story = lab.settle(Story(
            [Cohort(NEVER_PAID, Expect.CLOSED, death), Cohort(PAID_BETWEEN, Expect.PAID_OR_CLOSED, death)],
            kinds=[
                KindCohort(kinds.RESERVATIONS, LAPSES, True, "released, its stock back", death),
                KindCohort(kinds.RESERVATIONS, HELD_COMPLETED, False, "used, never released", None),
                KindCohort(kinds.RESERVATIONS, HELD_ABANDONED, True, "released once abandoned",
                           bounds.hold_released(t), heal_move=ShopMove.Move.ABANDONED),
                KindCohort(kinds.COMPLETIONS, COMPLETES, True, "completed", death),
                KindCohort(kinds.COMPLETIONS, RETURNED, False, "never completed", None),
                KindCohort(kinds.PLAIN_PAYMENT, PLAIN_NEVER_PAID, True, "cancelled", death),
                KindCohort(kinds.PLAIN_PAYMENT, PLAIN_PAID_EARLY, False, "paid, never cancelled", None),
                KindCohort(kinds.PLAIN_PAYMENT, PLAIN_PAID_AT, None, "paid or cancelled, not both", death),
                KindCohort(kinds.PLAIN_PAYMENT, PLAIN_PAID_LATE, True, "cancelled, its payment refused", death),
                *late_moves,
            ]))
    checks, facts = invariants.reminder_checks([round(1000 * lead) for lead in leads], death.total(0.0))
    refused = ShopMove.objects.filter(timer=kinds.PLAIN_PAYMENT, object_id__in=list(plain.of(PLAIN_PAID_LATE)),
                                      move=ShopMove.Move.REFUSED).count()
    story.checks += [
        *checks,
        Check("every save as paid of a cancelled PlainOrder raised OrderClosed", refused == tenth,
              f"{refused} of {tenth} refused"),
        Check("the shop's moves meant for before a deadline came before it", not any(late.values()),
              f"{sum(late.values())} came after it (the harness behind its plan): judged 'one or the other'",
              timing=True),
        Check("every row had its deadline before the first fell due", ready < start,
              f"the last came {(ready - start).total_seconds():.2f} s after it", timing=True),
        Check("consumers were killed while deadlines of every kind passed", pool.kills > 0),
    ]
    moved = dict(ShopMove.objects.values_list("move").annotate(count=Count("id")))
    story.facts.update({
        **facts, "rows of each kind": share,
        "shop's moves (completing, completed, abandoned, returned, paid, refused)": ", ".join(
            str(moved.get(move, 0)) for move in ("completing", "completed", "abandoned", "returned", "paid",
                                                 "refused")),
        "payments of orders refused (refund)": Payment.objects.filter(outcome=Payment.Outcome.REFUND).count(),
        "leased reminders noted at kills": len(stranded)})
    return story


def _spread_from(start: datetime, count: int, spread: float) -> list[datetime]:
    """``count`` deadlines evenly over ``spread`` seconds from ``start``, shuffled."""
    step = spread / max(1, count)
    due = [start + timedelta(seconds=i * step) for i in range(count)]
    random.shuffle(due)
    return due


# -- what a close tells the outside world: notices ----------------------------------------------

WEBHOOK = "order-expired-webhook"
DUE_BEFORE_REFUSAL = "due before the 503s"
DUE_WHILE_REFUSED = "due while the target refused"
PAID_FIRST = "paid before the deadline"
# The exit status of a consumer that dies right after a close's COMMIT (SHOP_EXIT_AFTER_COMMIT).
EXIT_AFTER_COMMIT = 9
# How long the target holds open the request whose sender the harness kills meanwhile.
HOLD_SECONDS = 0.3
# Seconds the kills go on once the target takes notices again: the backlog's first seconds.
KILLS_AFTER_REFUSAL = 5.0


@scenario("notices", "a webhook notice per closed order, to a local HTTP server: consumers SIGKILLed in the "
                     "handler and right after the close's COMMIT, the server refusing (503) a while, Redis "
                     "flushed with notices pending")
def notices(lab: Lab) -> Story:
    """Each close writes, in its transaction, one notice for the test shop's webhook handler
    (``notify_expired`` to ``order-expired-webhook``), which POSTs it to a server of the
    harness's own (``chaos.sink``), signed, with its key as ``Idempotency-Key``.

    1. From the first deadline on, about every second the server holds open the next request
       it accepts (recorded first, as a target that acts before it answers) while the harness
       SIGKILLs the consumer that sent it, in its handler; a fifth consumer runs with
       SHOP_EXIT_AFTER_COMMIT=1 and dies right after each close's COMMIT, before any
       after-commit work (its notices were announced to Redis a lease late, never scheduled).
    2. Halfway through the deadlines (or from the last one less half the refusal, if later)
       the server answers 503 to everything for ``sizes.refusal`` seconds (30; 5 with
       --quick), then takes notices again, the kills going on for KILLS_AFTER_REFUSAL more
       seconds.
    3. While it refuses, once every order is closed, the queue's Redis database is flushed:
       the notices pending then (in backoff) are left to the compensation scan.

    A twentieth of the orders is paid before its deadline: none of them may have a notice.
    """
    t, sizes = lab.tuning, lab.sizes
    death = bounds.consumer_death(t)
    secret = uuid.uuid4().hex
    pools: list[ConsumerPool] = []
    beats: list[Beat] = []

    def consumers_now() -> set[int]:
        return {pid for pool in pools for pid in pool.pids()}

    def senders() -> list[int]:
        return [*consumers_now(), *(pid for beat in beats for pid in beat.running_pids())]

    def kill(pid: int) -> bool:
        return any(pool.kill_pid(pid) for pool in pools)

    sink = Sink(secret=secret, candidates=senders, holdable=lambda pid: pid in consumers_now(), on_hold=kill,
                hold_seconds=HOLD_SECONDS)
    moments: dict[str, Any] = {}
    with sink:
        env: dict[str, Any] = {"SHOP_WEBHOOK_URL": sink.url, "SHOP_WEBHOOK_SECRET": secret, "SHOP_EMAIL_NOTICES": 0}
        with (lab.consumers(CONSUMERS, **env) as pool,
              lab.consumers(1, name="exit-after-commit", expected_status=EXIT_AFTER_COMMIT,
                            SHOP_EXIT_AFTER_COMMIT=1, SHOP_RECORD_EXPIRIES=1, **env) as exiting,
              lab.beat(**env) as beat):
            pools += [pool, exiting]
            beats.append(beat)
            # Long enough that notices closed before the refusal have a lease and the slack to reach
            # the target first (12 s with --quick); the refusal from halfway, or later, so that the
            # last close comes early enough in it for the flush to find its notices still refused.
            spread = max(sizes.spread, 2 * (death.seconds + 1))
            created = lab.create_orders(sizes.count(0.5), spread=spread, cohort=DUE_BEFORE_REFUSAL)
            due = _deadlines(created.ids)
            refuse_at = max(lab.after(created.first_deadline, spread / 2),
                            lab.after(created.last_deadline, -sizes.refusal / 2))
            orders.assign([pk for pk, at in due.items() if at >= refuse_at], DUE_WHILE_REFUSED)
            paid = random.sample(created.ids, max(1, len(created.ids) // 20))
            orders.assign(paid, PAID_FIRST)
            plan = {pk: due[pk] - timedelta(seconds=random.uniform(0.5, 1.0)) for pk in paid}
            with repeatedly(1.0, sink.hold_next):
                kinds.alongside(lambda: orders.pay_at(plan, threads=4),
                                lambda: _refuse_then_flush(lab, sink, created, refuse_at, moments))
            delivered_all = _wait_for_notices(lab, moments["back_at"])
            story = lab.settle(Story([Cohort(DUE_BEFORE_REFUSAL, Expect.CLOSED, death),
                                      Cohort(DUE_WHILE_REFUSED, Expect.CLOSED, death),
                                      Cohort(PAID_FIRST, Expect.PAID_OR_CLOSED, death)]))
        requests = sink.requests()
    checks, facts = invariants.notice_checks(requests, WEBHOOK)
    story.checks += checks
    scans = {scan.pid for scan in beat.scans}
    died_after_commit = [e.pid for e in exiting.exits if e.status == EXIT_AFTER_COMMIT]
    closed_then_died = set(Delivery.objects.filter(pid__in=died_after_commit).values_list("order_id", flat=True))
    arrivals = invariants.notice_lateness(requests, WEBHOOK)
    late = {pk: first - closed for pk, (closed, first) in arrivals.items()}
    refused_at, back_at = moments["refused_at"].timestamp(), moments["back_at"].timestamp()
    # Closed a lease and the slack before the refusal: nothing but the kills between them and the target.
    calm = [late[pk] for pk, (closed, _first) in arrivals.items() if closed < refused_at - death.seconds]
    after_back = [first - back_at for closed, first in arrivals.values() if closed >= refused_at]
    held = [request for request in requests if request.held]
    kills = pool.kills + exiting.kills
    refused = sum(1 for request in requests if request.status == REFUSED)
    by_scan = [request for request in requests if request.pid in scans]
    rebuilt = sum(QueueEpoch.objects.values_list("rebuilds", flat=True))
    story.checks += [
        Check("consumers were SIGKILLed in the handler (the target holding their request)",
              bool(held) and kills > 0, f"{len(held)} requests held, {kills} kills"),
        Check("consumers died right after a close's COMMIT (SHOP_EXIT_AFTER_COMMIT)", bool(closed_then_died),
              f"{len(died_after_commit)} exits, {len(closed_then_died)} orders closed by them"),
        Check("the notices of the orders whose consumer died right after the COMMIT reached the target",
              closed_then_died <= set(arrivals), f"{len(closed_then_died - set(arrivals))} did not"),
        Check("the target refused notices (503)", bool(refused), f"{refused} requests refused"),
        Check("notices were pending when Redis was flushed", moments["pending_at_flush"] > 0,
              f"{moments['pending_at_flush']} pending"),
        # Since the epochs (0.3) a consumer notices the flush (the queue's epoch marker gone) and puts the
        # notices back itself; the scan delivers what is left, if anything.
        Check("the notices Redis had lost were put back by a consumer's rebuild or delivered by a scan",
              bool(by_scan) or rebuilt, f"{len(by_scan)} requests from scans, consumer rebuilds: {rebuilt}"),
        Check("every notice delivered before the harness stopped waiting", delivered_all),
        Check("every order was closed before Redis was flushed", moments["unclosed_at_flush"] == 0,
              f"{moments['unclosed_at_flush']} were not (their members went with the flush)", timing=True),
        Check(f"notices of orders closed before the refusal delivered within the bound ({death.formula} after "
              f"the close)", bool(calm) and max(calm) <= death.seconds,
              f"latest {max(calm):.2f} s after its close" if calm else "no order closed that early", timing=True),
    ]
    ordered = sorted(late.values())
    story.facts.update({
        **facts,
        "consumers killed in the handler": len(held),
        "consumer exits right after a close's COMMIT (their orders)": f"{len(died_after_commit)} "
                                                                       f"({len(closed_then_died)})",
        "notices pending when Redis was flushed": moments["pending_at_flush"],
        "requests from scans (accepted)": f"{len(by_scan)} ({sum(1 for r in by_scan if r.accepted)})",
        "delivery after the close, p50 / p99 / max (s)": " / ".join(
            f"{value:.2f}" for value in (_quantile(ordered, 0.5), _quantile(ordered, 0.99), ordered[-1])
        ) if ordered else "–",
        "latest of those closed before the refusal, after the close (s)": round(max(calm), 2) if calm else "–",
        "latest of those closed while refused, after the target came back (s)":
            round(max(after_back), 2) if after_back else "–",
        "refused for (s)": round(back_at - refused_at, 1),
    })
    return story


def _refuse_then_flush(lab: Lab, sink: Sink, created: orders.Created, refuse_at: datetime,
                       moments: dict[str, Any]) -> None:
    """The target refuses from ``refuse_at`` for ``sizes.refusal`` seconds; meanwhile, once every
    order is closed (so that no close member goes with it), the queue's Redis database is flushed."""
    try:
        lab.wait_until(refuse_at)
        sink.refusing.set()
        moments["refused_at"] = lab.now()
        back_at = lab.after(moments["refused_at"], lab.sizes.refusal)
        flush_by = lab.after(back_at, -min(1.0, lab.sizes.refusal / 4))
        lab.wait_until(min(lab.after(created.last_deadline, 0.5), flush_by))
        model = get_order_model()
        unclosed = model._base_manager.filter(model.unpaid_q())
        while lab.now() < flush_by and unclosed.exists():
            time.sleep(0.1)
        moments["unclosed_at_flush"] = unclosed.count()
        moments["pending_at_flush"] = Notice.objects.filter(state=Notice.State.PENDING).count()
        queueview.flush()
        moments["flushed_at"] = lab.now()
        lab.wait_until(back_at)
        sink.refusing.clear()
        moments["back_at"] = lab.now()
        time.sleep(KILLS_AFTER_REFUSAL)
    finally:
        sink.refusing.clear()
        connection.close()


def _wait_for_notices(lab: Lab, back_at: datetime) -> bool:
    """Until no notice is pending (every one delivered, or a dead letter); False if that took longer
    than the longest path: every retry (a notice Redis lost starts its count again) after the target
    came back, a scan's grace, two beats and the slack."""
    t = lab.tuning
    give_up = lab.after(back_at, sum(t.notice_retry_delays) + t.compensation_grace
                        + 2 * t.compensation_interval + bounds.SLACK)
    pending = Notice.objects.filter(state=Notice.State.PENDING)
    while lab.now() < give_up:
        if not pending.exclude(pk__in=DeadLetter.objects.filter(timer="notices", resolved_at__isnull=True)
                               .values("order_id")).exists():
            return True
        time.sleep(0.25)
    return False


def _quantile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


# How late the slow target answers each notice, as a share of the webhook's timeout (half the lease).
SLOW_ANSWER = 0.8


@scenario("notices-slow-target", "notices Redis lost, delivered by the scan to a target that answers slowly "
                                 "(the scan delivers a chunk a claim's worth at a time, its lock renewed "
                                 "between them: no scan delivers what another has in hand)")
def notices_slow_target(lab: Lab) -> Story:
    """No process dies and the target refuses nothing for good; it is only slow.

    The target refuses (503) while the orders close, so every notice is pending, in backoff;
    then the queue's Redis database is flushed, and the target takes notices again, answering
    each SLOW_ANSWER of the webhook's timeout late. The scan delivers a chunk
    (COMPENSATION_CHUNK, 500) 16 at a time, so a chunk lasts about chunk / 16 x that answer,
    and the scan's lock (COMPENSATION_LOCK_SECONDS) is renewed only between chunks: once a
    chunk outlives it, the next beat's scan takes the lock and delivers the same notices,
    still pending, again. At least once allows that; with nothing failing it should not happen.
    """
    t = lab.tuning
    secret = uuid.uuid4().hex
    beats: list[Beat] = []
    sink = Sink(secret=secret, candidates=lambda: [pid for beat in beats for pid in beat.running_pids()])
    with sink:
        env: dict[str, Any] = {"SHOP_WEBHOOK_URL": sink.url, "SHOP_WEBHOOK_SECRET": secret, "SHOP_EMAIL_NOTICES": 0}
        with lab.consumers(CONSUMERS, **env), lab.beat(**env) as beat:
            beats.append(beat)
            sink.refusing.set()
            created = lab.create_orders(lab.sizes.count(0.15, at_least=800), spread=lab.sizes.spread)
            lab.wait_until(lab.after(created.last_deadline, t.lease_seconds))
            pending = Notice.objects.filter(state=Notice.State.PENDING).count()
            queueview.flush()
            sink.answer_delay = SLOW_ANSWER * t.lease_seconds / 2
            sink.refusing.clear()
            flushed = lab.now()
            delivered_all = _wait_for_notices(lab, flushed)
            story = lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.consumer_death(t))]))
        requests = sink.requests()
    checks, facts = invariants.notice_checks(requests, WEBHOOK)
    after_flush = [request for request in requests if request.accepted and request.at >= flushed.timestamp()]
    # The same attempt accepted twice: two deliverers had the notice in hand at once. A later attempt
    # after an accepted one is a retry its sender owed (its answer came after the client's timeout, on
    # a loaded machine): at least once, as promised, and counted apart.
    accepted = Counter((request.key, request.attempt) for request in after_flush)
    twice = {key: count for key, count in accepted.items() if count > 1}
    retried = Counter(request.key for request in after_flush)
    owed_retries = sum(count - 1 for count in retried.values()) - sum(count - 1 for count in twice.values())
    scans = {scan.pid for scan in beat.scans}
    story.checks += [check for check in checks if check.name != "every repeat of a notice carries the same body"]
    story.checks += [
        Check("notices were pending when Redis was flushed", pending > 0, f"{pending} pending"),
        Check("every notice delivered before the harness stopped waiting", delivered_all),
        Check("no notice delivered twice by the scans, with nothing failing (a slow target only)", not twice,
              f"{len(twice)} notices delivered more than once in one attempt after the flush "
              f"({sum(twice.values()) - len(twice)} duplicates); longest scan "
              f"{max((scan.seconds for scan in beat.scans), default=0):.1f} s, "
              f"COMPENSATION_LOCK_SECONDS {t.compensation_lock_seconds:g}"),
    ]
    by_scan = [request for request in requests if request.pid in scans]
    story.facts.update({**facts, "notices pending when Redis was flushed": pending,
                        "answers late by (s)": sink.answer_delay,
                        "accepted again by a later attempt (an answer past the client's timeout)": owed_retries,
                        "requests from scans (accepted)": f"{len(by_scan)} ({sum(1 for r in by_scan if r.accepted)})",
                        "delivered after the flush within (s)": round(
                            max((request.at for request in requests), default=flushed.timestamp())
                            - flushed.timestamp(), 1)})
    return story


MALFORMED = ["", "abc", " 7", "07", "+7", "7.0", "1e3", "-0", "٣", "7\n", "[7]", "None", "🙂",
             "x" * 300, "9" * 25, "-1", "0", "18446744073709551616"]


@scenario("malformed", "malformed members (and members of no row) injected into Redis among due ones")
def malformed(lab: Lab) -> Story:
    junk = [*MALFORMED, *(f"junk-{random.getrandbits(32):x}" for _ in range(lab.sizes.count(0.02, 10)))]
    with lab.consumers(CONSUMERS), lab.beat():
        created = lab.create_orders()
        highest = max(created.ids)
        junk += [str(highest + 1 + i) for i in range(5)]  # rows that were never there
        for share, wave in enumerate((junk[0::3], junk[1::3], junk[2::3])):
            queueview.inject_malformed(
                wave, created.first_deadline + timedelta(seconds=share * lab.sizes.spread / 3))
        story = lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.normal(lab.tuning))]))
    left = queueview.present_among(junk)
    story.checks.append(Check("every malformed member was dropped from Redis", not left,
                              f"still there: {left[:5]!r}"))
    story.facts["malformed members injected"] = len(junk)
    return story


@scenario("poison", "members that are not UTF-8 and scores of +inf injected into Redis during the sigkill "
                    "loop")
def poison(lab: Lab) -> Story:
    injected = 0

    def inject() -> None:
        nonlocal injected
        injected += queueview.inject_poison(datetime.now(UTC) - timedelta(seconds=1), f"{injected}")

    with lab.consumers(CONSUMERS, CHAOS_DELIVERY_DELAY=0.002) as pool, lab.beat():
        created = lab.create_orders(spread=1.6 * lab.sizes.spread)
        with repeatedly(1.0, pool.kill_one), repeatedly(0.5, inject):
            lab.wait_until(lab.after(created.last_deadline, lab.tuning.lease_seconds))
        story = lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.consumer_death(lab.tuning))]))
    moved = queueview.quarantined()
    story.checks.append(Check("every injected member was moved to the quarantine, none left queued",
                              injected > 0 and moved == injected, f"{moved} of {injected}"))
    story.checks.append(Check("consumers were killed while the poison came in", pool.kills > 0))
    story.facts["poisoned members injected"] = injected
    return story


@scenario("deletes", "rows deleted while their members are leased (with signals and behind the ORM)")
def deletes(lab: Lab) -> Story:
    quota = lab.sizes.count(0.02, at_least=20)
    # 30 ms between each claim and its lock: some rows go before the lock, some after the close.
    with lab.consumers(CONSUMERS, CHAOS_LOCK_DELAY=0.03, CHAOS_DELIVERY_DELAY=0.001), lab.beat():
        created = lab.create_orders()
        deleted = _delete_while_leased(lab, created, quota)
        orders.assign(deleted, "deleted")
        story = lab.settle(Story([Cohort("orders", Expect.CLOSED, bounds.normal(lab.tuning)),
                                  Cohort("deleted", Expect.DELETED, None)]))
    closed_first = Delivery.objects.filter(order_id__in=deleted).count()
    story.checks.append(Check("rows were deleted while leased", len(deleted) >= min(10, quota),
                              f"{len(deleted)} (aimed at {quota})"))
    story.facts.update({"rows deleted while leased": len(deleted),
                        "of which closed before the delete": closed_first})
    return story


def _delete_while_leased(lab: Lab, created: orders.Created, quota: int) -> list[int]:
    """Watch the lease set; delete rows whose members are leased, alternately with and without signals."""
    model = get_order_model()
    deleted: list[int] = []
    deadlines = _deadlines(created.ids)
    stop_at = lab.after(created.last_deadline, 1.0)
    while len(deleted) < quota and lab.now() < stop_at:
        # Due within the last second: the ones a consumer may hold right now.
        now, second = lab.now(), timedelta(seconds=1)
        due = [pk for pk, deadline in deadlines.items() if now - second <= deadline <= now]
        sample = random.sample(due, min(len(due), 400))
        for member in queueview.leased_among(str(pk) for pk in sample)[:2]:
            pk = int(member)
            if len(deleted) % 2:
                _delete_behind_the_orm(model, pk)
            else:
                with transaction.atomic():  # locked first: a close in flight adds rows pointing at it
                    rows = model._base_manager.select_for_update().filter(pk=pk)
                    list(rows.values_list("pk"))
                    rows.delete()
            deleted.append(pk)
            deadlines.pop(pk)
        time.sleep(0.02)
    return deleted


def _delete_behind_the_orm(model: type[Model], pk: int) -> None:
    """DELETE in SQL, as another system would: no signal, so nothing tells Redis.

    The row is locked first (a close in flight finishes), then the rows pointing at it
    (a shop's status changes) go, then the row, in one transaction.
    """
    table, pk_column = model._meta.db_table, model._meta.pk.column
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT {pk_column} FROM {table} WHERE {pk_column} = %s FOR UPDATE", [pk])
        for rel in model._meta.related_objects:
            cursor.execute(f"DELETE FROM {rel.related_model._meta.db_table} "
                           f"WHERE {rel.field.column} = %s", [pk])
        cursor.execute(f"DELETE FROM {table} WHERE {pk_column} = %s", [pk])


def _deadlines(ids: list[int]) -> dict[int, datetime]:
    return dict(get_order_model()._base_manager.filter(pk__in=ids).values_list("pk", "expires_at"))


@scenario("receivers", "receivers that raise (always, sometimes), hang, os._exit() or outlive the lease")
def receivers(lab: Lab) -> Story:
    t, sizes = lab.tuning, lab.sizes
    hang_seconds = 5 * t.lease_seconds
    env: dict[str, Any] = {"CHAOS_BEHAVIOURS": 1, "CHAOS_HANG_SECONDS": hang_seconds,
                           "CHAOS_OVERRUN_SECONDS": t.lease_seconds + 0.5, "CHAOS_FLAKY_RATE": 0.5}
    B = Role.Behaviour
    # Every exit, hang and overrun costs a consumer a restart (a hung one exits once its
    # batch is given up): so 6 consumers, and the hang, the exits and the overruns
    # spaced, each chain starting when the one before has handed over. The deadlines
    # come at 250 a second, not 400: every delivery here costs two queries, and a batch
    # that meets a raising receiver runs twice; at 400 a second the 2-core machine had
    # no headroom left for the restarts (batches of 50 took up to a second).
    heavy = [B.HANG, *[B.EXIT, B.OVERRUN] * sizes.misbehaving[B.EXIT]]
    every = 2 * t.lease_seconds + 0.5
    light: dict[str, int] = {B.RAISE: sizes.misbehaving[B.RAISE], B.FLAKY: sizes.misbehaving[B.FLAKY]}
    with (lab.consumers(CONSUMERS + 2, expected_status=EXIT_STATUS, **env) as pool,
          lab.beat(**env)):
        lab.create_orders(spread=max(1.6 * sizes.spread, len(heavy) * every + 1), misbehaving=light,
                          spaced=(heavy, every), cohort="well-behaved")
        fails, kills = bounds.receiver_fails_among_deaths(t), bounds.receiver_kills(t)
        story = lab.settle(Story([
            Cohort("well-behaved", Expect.CLOSED, bounds.batch_of_a_killer(t)),
            Cohort(B.RAISE, Expect.CLOSED_OR_DEAD, fails),
            Cohort(B.FLAKY, Expect.CLOSED_OR_DEAD, fails),
            Cohort(B.HANG, Expect.CLOSED_OR_DEAD, kills),
            Cohort(B.OVERRUN, Expect.CLOSED_OR_DEAD, kills),
            Cohort(B.EXIT, Expect.CLOSED_OR_DEAD, kills),
        ]))
    exits = sum(1 for e in pool.exits if e.status == EXIT_STATUS)
    story.checks.append(Check("receivers took their consumers down", exits > 0, f"{exits} exits"))
    story.facts["hang (s)"] = hang_seconds
    return story


# The default LEASE_SECONDS: the poison scenario shows what the heartbeat alone gives.


@scenario("poison-killer", "a receiver that os._exit()s every consumer that takes its order, at the "
                           "default LEASE_SECONDS (30 s): only the heartbeat hands its batches over")
def poison_killer(lab: Lab) -> Story:
    t, sizes = lab.tuning, lab.sizes
    B = Role.Behaviour
    killers = sizes.misbehaving[B.EXIT]
    # One burst per killer, due within a third of a second, so its batch is full of others; one
    # killer's MAX_TAKEOVERS + 1 deaths are over before the next burst falls due.
    every = bounds.poison_buried(t).seconds
    env: dict[str, Any] = {"CHAOS_BEHAVIOURS": 1, "ORDER_TIMEOUT_LEASE_SECONDS": DEFAULT_LEASE_SECONDS}
    # Four batches' worth per burst: enough that the killer's batch is full of others, few enough
    # that the burst itself is not a backlog (a full run's 3,333 due within 0.3 s would be
    # 11,000 a second on the 2-core machine, with consumers dying: the bound would measure that).
    burst_size = min(sizes.orders // killers, 4 * t.batch_size)
    with lab.consumers(CONSUMERS, expected_status=EXIT_STATUS, **env) as pool:
        for burst in range(killers):
            lab.create_orders(burst_size, lead=sizes.lead + burst * every, spread=0.3,
                              misbehaving={B.EXIT: 1}, cohort="its batches")
        story = lab.settle(Story([
            Cohort("its batches", Expect.CLOSED, bounds.poisoned_batch(t)),
            Cohort(B.EXIT, Expect.CLOSED_OR_DEAD, bounds.poison_buried(t)),
        ]))
    exits = sum(1 for e in pool.exits if e.status == EXIT_STATUS)
    deaths = killers * (t.max_takeovers + 1)
    story.checks.append(Check("each poison member killed MAX_TAKEOVERS + 1 consumers", exits == deaths,
                              f"{exits} exits, {deaths} expected"))
    story.facts["LEASE_SECONDS"] = DEFAULT_LEASE_SECONDS
    return story


# -- receivers that are slow, not broken --------------------------------------------------------

# An order's receiver time in slow-receivers (an ERP answering slowly on a busy day), and its
# consumers: the app's own BATCH_SIZE, so a full batch (4 s of receivers) runs twice past
# BATCH_TIME_LIMIT.
SLOW_DELIVERY = 0.02
SLOW_CONSUMERS = 2
SLOW_BATCH_SIZE = 200
SLOW_TIME_LIMIT = 2.0
PAID_RACING = "paid at the deadline"
PAID_IN_BACKLOG = "paid while the backlog drains"
# The guard's line, once per batch given up for time (timers/leases.py), and the consumer's when it
# claims fewer from then on (timers/sizing.py; none before it learned to).
GIVEN_UP_FOR_TIME = "still running after BATCH_TIME_LIMIT"
_CLAIMING_AT_MOST = re.compile(r"was given up for time with \d+ done: claiming at most (\d+)")


@scenario("slow-receivers", "a burst due at once whose receivers take 20 ms an order (healthy, just slow), on 2 "
                            "consumers with BATCH_SIZE 200 and BATCH_TIME_LIMIT 2 s; payments racing the closes")
def slow_receivers(lab: Lab) -> Story:
    """Nothing fails: the receivers are only slow, so a full batch runs past BATCH_TIME_LIMIT.

    Each consumer's first claim takes a full batch (the burst is due in one millisecond), which
    overruns and is given up: its session ended, its members handed to the next claim. From then
    on the consumer claims half of what that batch got done, batches that fit (timers/sizing.py),
    so it gives up no other. Before the claims shrank, each consumer gave up batch after batch,
    each taken over whole again.
    A tenth of the orders is paid as the burst falls due (against the first batches, their rows
    locked until the give-up ends that session) and a tenth while the backlog drains.
    """
    sizes = lab.sizes
    pace = bounds.receiver_pace(sizes.burst, SLOW_DELIVERY, SLOW_CONSUMERS)
    receivers = sizes.burst * SLOW_DELIVERY / SLOW_CONSUMERS
    # No beat: the scan's COMPENSATION_GRACE here (5 s; 150 s by default) is shorter than the backlog,
    # so the scan would close what the consumers have pending, with the same slow receivers.
    with lab.consumers(SLOW_CONSUMERS, CHAOS_DELIVERY_DELAY=SLOW_DELIVERY,
                       ORDER_TIMEOUT_BATCH_SIZE=SLOW_BATCH_SIZE, ORDER_TIMEOUT_BATCH_TIME_LIMIT=SLOW_TIME_LIMIT):
        created = lab.create_orders(sizes.burst, lead=sizes.lead + 1, spread=0.001, cohort=NEVER_PAID)
        paid = random.sample(created.ids, len(created.ids) // 5)
        racing, backlog = paid[0::2], paid[1::2]
        orders.assign(racing, PAID_RACING)
        orders.assign(backlog, PAID_IN_BACKLOG)
        first, second = created.first_deadline, timedelta(seconds=1)
        plan = {pk: first + second * random.uniform(-0.1, 0.05) for pk in racing}
        plan |= {pk: first + second * random.uniform(0.1, receivers) for pk in backlog}
        orders.pay_at(plan, threads=8)
        story = lab.settle(Story([Cohort(NEVER_PAID, Expect.CLOSED, pace),
                                  Cohort(PAID_RACING, Expect.PAID_OR_CLOSED, pace),
                                  Cohort(PAID_IN_BACKLOG, Expect.PAID_OR_CLOSED, pace)]))
    logs = {log.stem: log.read_text(errors="replace") for log in sorted(lab.logs.glob("consumer-*.log"))}
    given_up = {name: text.count(GIVEN_UP_FOR_TIME) for name, text in logs.items()}
    claims = {name: _CLAIMING_AT_MOST.findall(text) for name, text in logs.items()}
    last_close = Delivery.objects.aggregate(last=Max("delivered_at"))["last"]
    answers = dict(Payment.objects.values_list("outcome").annotate(count=Count("order_id")))
    per_consumer = ", ".join(f"{name}: {count}" for name, count in given_up.items())
    # Not a timing check: the receivers' sleep is most of a batch's time, so a second give-up would
    # need a batch of what fits to take twice as long as the first batch's orders did.
    story.checks += [
        Check("the first full batches ran past BATCH_TIME_LIMIT and were given up", sum(given_up.values()) > 0,
              "no batch was given up: the scenario did not overrun"),
        Check("each consumer gave up at most one batch for time (then claimed what fits)",
              bool(given_up) and max(given_up.values()) <= 1, f"batches given up per consumer: {per_consumer}"),
    ]
    story.facts.update({
        "batches given up for time, per consumer": per_consumer,
        "claims from then on, per consumer": ", ".join(
            f"{name}: {' then '.join(found) or '–'}" for name, found in claims.items()),
        f"receivers' time, orders x {1000 * SLOW_DELIVERY:g} ms / consumers (s)": round(receivers, 1),
        "drained: the last close after the first deadline (s)":
            round((last_close - first).total_seconds(), 2) if last_close else "–",
        "payments that won": answers.get(Payment.Outcome.PAID, 0),
        "payments refused (refund)": answers.get(Payment.Outcome.REFUND, 0)})
    return story


# -- receivers that never return -------------------------------------------------------------


@scenario("hang-forever", "a receiver that never returns, with 4 consumers: each one it holds exits (75) "
                          "and is restarted")
def hang_forever(lab: Lab) -> Story:
    """One order whose receiver never returns, early among ordinary ones.

    The lease guard ends the hung batch's database session and hands its
    members over; the Python thread stays in the receiver, so the consumer
    exits (EXIT_STUCK) and the supervisor starts another. Each takeover costs
    one such restart, until MAX_TAKEOVERS buries the order.
    """
    t = lab.tuning
    env: dict[str, Any] = {"CHAOS_BEHAVIOURS": 1, "CHAOS_HANG_SECONDS": 3600}
    with lab.consumers(CONSUMERS, **env), lab.beat(**env) as beat:
        lab.create_orders(spread=max(lab.sizes.spread, 9.0), spaced=([Role.Behaviour.HANG], 1.0))
        story = lab.settle(Story([
            Cohort("orders", Expect.CLOSED, bounds.batch_of_a_killer(t)),
            Cohort(Role.Behaviour.HANG, Expect.CLOSED_OR_DEAD, bounds.receiver_kills(t)),
        ]))
        story.facts["scans still running at the end"] = beat.still_running
    return story


@scenario("hang-in-scan", "no consumer runs, and the scan meets a receiver that never returns")
def hang_in_scan(lab: Lab) -> Story:
    """The scan closes a chunk in one transaction, under the consumers' session limits.

    The database ends the hung chunk's transaction after LEASE_SECONDS, so a
    payment of any of its orders gets an answer within that (not a lock wait
    timeout); the command exits (EXIT_STUCK) and the next scans close the
    others one at a time and bury the hung one after MAX_TAKEOVERS.
    """
    t = lab.tuning
    env: dict[str, Any] = {"CHAOS_BEHAVIOURS": 1, "CHAOS_HANG_SECONDS": 3600}
    with lab.beat(**env):
        created = lab.create_orders(50, spread=1.0, spaced=([Role.Behaviour.HANG], 0.1))
        # The first scan that finds them overdue has started, and hangs.
        lab.wait_until(lab.after(created.last_deadline,
                                 t.compensation_grace + t.compensation_interval + 2))
        model = get_order_model()
        victim = model._base_manager.filter(model.unpaid_q(), pk__in=created.ids).exclude(
            pk__in=Role.objects.filter(behaviour=Role.Behaviour.HANG).values("order_id")).first()
        answer, waited = _pay_with_lock_timeout(victim, seconds=5)
        story = lab.settle(Story([
            Cohort("orders", Expect.PAID_OR_CLOSED, bounds.scan_stuck_others(t)),
            Cohort(Role.Behaviour.HANG, Expect.CLOSED_OR_DEAD, bounds.scan_stuck_culprit(t)),
        ]))
    story.checks.append(Check("a payment gets its answer within LEASE_SECONDS", waited <= t.lease_seconds,
                              f"mark_paid() answered {answer} after {waited:.1f} s"))
    return story


def _pay_with_lock_timeout(order: object, seconds: int) -> tuple[str, float]:
    """Pay, waiting at most ``seconds`` for the row lock; (what it answered, how long it took)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")
    began = time.monotonic()
    try:
        answer = orders.pay(order)
    except Exception as exc:  # what a payment callback would see
        answer = f"{type(exc).__name__}: {exc}"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
    return answer, time.monotonic() - began
