"""Consumers as real processes: racing, killed, stopped by signals."""

from __future__ import annotations

import re
import signal
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Count
from django.utils import timezone

from order_timeout import schedule
from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.models import DeadLetter, Order
from order_timeout.timers.members import now_score
from order_timeout.timers.watchdog import EXIT_STUCK
from testproject.shop.models import Expiry

from .conftest import Clock, both_models, both_redis, wait_for
from .helpers import INNODB_TRX_POLL, count_in, leased_members, open_transactions_elsewhere, pending_count

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def due_orders(count: int, model: type = Order) -> list:
    deadline = timezone.now() - timedelta(seconds=1)
    orders = model.objects.bulk_create([model(expires_at=deadline) for _ in range(count)])
    schedule(orders)
    return orders


def closed_count(stdout: str) -> int:
    return int(re.search(r"(\d+) closed", stdout).group(1))


def dead_lettered_count(stdout: str) -> int:
    return int(re.search(r"(\d+) dead-lettered", stdout).group(1))


def buried_in(stderr: str) -> dict[str, int]:
    """The orders a consumer's log says it dead-lettered after takeovers, with their takeovers."""
    return {member: int(times) for member, times in
            re.findall(r"order=(\S+) taken over (\d+) times: dead-lettered without another try", stderr)}


def started(process) -> bool:
    # The banner is printed once the consumer is built and signals are set up.
    return "running" in process.out


@both_redis
@both_models
@pytest.mark.parametrize("lease_seconds, receiver_seconds", [("30", "0"), ("0.5", "0.05")],
                         ids=["lease-30s", "batches-overrun-their-lease"])
def test_pitfall_3_racing_consumers_close_every_order_exactly_once(consumer_process, queue, lease_seconds,
                                                                  receiver_seconds, order_model):
    """Seed pitfall 3: several consumers. With receivers of 50 ms an order, a batch of 50
    overruns its 0.5 s lease, is given up and handed out again while still being closed, so
    the row lock must settle the race (on fewer orders: given-up members are taken over one per
    claim, which is slow by design). A 50 ms lease did that only on a fast machine: on a busy
    one each member's single close overran it too, and was taken over until its dead letter.
    Receivers of 20 ms did it only where a claim held 25 orders or more: on the cluster's 16
    shards a claim holds about 12 of the 200, and a CI run saw no batch overrun at all."""
    # Twelve batches of 50 for three racers; four when every batch overruns its lease.
    count = 600 if lease_seconds == "30" else 200
    env = {"ORDER_TIMEOUT_LEASE_SECONDS": lease_seconds, "SHOP_DELAY_SECONDS": receiver_seconds}
    racers = [consumer_process("--batch-size", "50", env=env) for _ in range(3)]
    # All at the start line, however long each process takes to start; then the orders fall due.
    for racer in racers:
        racer.wait_until(lambda racer=racer: started(racer))
    due_orders(count, order_model)
    # A racer whose given-up batch was still in hand a second later (a receiver thread that a busy
    # machine kept from the CPU) exits EXIT_STUCK, as designed; its supervisor starts it again.
    stuck: list[tuple[int, str, str]] = []

    def supervised() -> None:
        for index, racer in enumerate(racers):
            if racer.proc.poll() == EXIT_STUCK:
                stuck.append(racer.wait())
                racers[index] = consumer_process("--batch-size", "50", env=env)

    # Every order closed or dead-lettered, and nothing left in Redis (rows another racer held
    # come back a second later; given-up leases go to the next claim). At least: one closed
    # and dead-lettered too is for the assertions below to report, not for the wait to hide.
    # The orders' own dead letters: the notices their closes wrote overrun the lease too.
    buried = DeadLetter.objects.filter(order_model=order_model._meta.label)
    wait_for(lambda: supervised() or (count_in(order_model, "closed") + buried.count() >= count
                                      and pending_count(queue) == 0 and leased_members(queue) == []))
    for racer in racers:  # one started again at the end has its signal handlers before its SIGTERM
        racer.wait_until(lambda racer=racer: started(racer))
        racer.signal(signal.SIGTERM)
    ended = [racer.wait() for racer in racers]
    # One may have found itself stuck after the last wait, before its SIGTERM: the same verdict.
    stuck += [result for result in ended if result[0] == EXIT_STUCK]
    results = [result for result in ended if result[0] != EXIT_STUCK]

    assert [code for code, _, _ in results] == [0] * len(results), [err for _, _, err in results]
    assert all("giving it up" in err for _, _, err in stuck), [err for _, _, err in stuck]
    assert not Expiry.objects.values("order_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    per_process = [closed_count(out) for _, out, _ in results]
    # Each dead letter is one a racer reports it wrote, for an order taken over once more than
    # MAX_TAKEOVERS: when every try overran the lease.
    letters = {letter.order_id: letter for letter in buried}
    reported: dict[str, int] = {}
    for _, _, err in results + stuck:
        reported.update(buried_in(err))
    if stuck:
        # A racer that left stuck may have committed a dead letter in the thread it left behind
        # and gone before that thread logged it: no letter it did not write, at least.
        assert set(reported) <= set(letters)
    else:
        assert sorted(letters) == sorted(reported)
        assert sum(dead_lettered_count(out) for _, out, _ in results) == len(letters)
    assert {(letter.error_type, letter.attempts) for letter in letters.values()} <= {
        ("order_timeout.exceptions.RepeatedTakeover", order_settings.MAX_TAKEOVERS + 1)}
    assert set(reported.values()) <= {order_settings.MAX_TAKEOVERS + 1}
    assert Expiry.objects.count() == count_in(order_model, "closed") == count - len(letters)
    if lease_seconds == "30":
        assert letters == {} and stuck == []  # a 30 s lease's stuck verdict comes after 10 s
        assert sum(per_process) == count
    else:
        assert any("giving it up" in err for _, _, err in results + stuck)  # the overrun this case is about
        # A batch given up as its commit went through closed its orders without knowing it
        # (and a racer started again reports only its own): the processes may report fewer.
        assert sum(per_process) <= count
    assert sum(1 for n in per_process if n) + len(stuck) >= 2, per_process  # they really raced


def from_score(ms: int) -> datetime:
    """The instant a score (ms since the epoch) stands for."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


@both_redis
@both_models
def test_orders_of_a_consumer_killed_after_its_claim_are_closed_after_the_lease(consumer_process, queue,
                                                                               order_model, tmp_path):
    orders = due_orders(20, order_model)
    stall = tmp_path / "claimed"
    victim = consumer_process("--batch-size", "20", env={"SHOP_STALL_FILE": str(stall)})
    # A process, Django and the first claim take what they take on a busy machine: wait for
    # the claim itself (its first delivery makes the file), for as long as the test may run.
    victim.wait_until(stall.exists)

    victim.kill()
    wait_for(lambda: open_transactions_elsewhere() == 0, interval=INNODB_TRX_POLL)  # rolled back

    # Its first claim (a shard's due members, all 20 with one shard) stays leased.
    claimed = leased_members(queue)
    assert claimed and set(claimed) <= {str(o.pk) for o in orders}
    assert count_in(order_model, "unpaid") == 20
    assert Expiry.objects.count() == 0
    # Its leases as Redis holds them, however long the test took to get here.
    leases = [where.lease_ms for where in queue.positions(claimed).values()]
    within_lease = Clock(from_score(min(leases) - 1))
    others = Consumer(now=within_lease, follow_database_clock=False).run(once=True)
    assert others.closed == 20 - len(claimed)
    assert sorted(leased_members(queue)) == claimed
    after_lease = Clock(from_score(max(leases) + 1))
    stats = Consumer(now=after_lease, follow_database_clock=False).run(once=True)
    assert stats.closed == len(claimed)
    assert count_in(order_model, "closed") == 20
    assert Expiry.objects.count() == 20
    assert leased_members(queue) == []


def test_sigterm_finishes_the_batch_in_hand_and_exits_cleanly(consumer_process, queue):
    orders = due_orders(200)
    # 50 ms a delivery: a batch of 20 takes a second, all 200 at least ten.
    worker = consumer_process("--batch-size", "20", env={"SHOP_DELAY_SECONDS": "0.05"})
    worker.wait_until(Expiry.objects.exists)

    worker.signal(signal.SIGTERM)
    code, out, err = worker.wait()

    assert code == 0, err
    assert "finishing the batch" in err
    assert leased_members(queue) == []
    closed = set(Order.objects.filter(status=Order.Status.CLOSED).values_list("pk", flat=True))
    assert 0 < len(closed) < 200
    assert Expiry.objects.count() == len(closed)
    # Whatever was not closed is still waiting in the queue: nothing lost.
    assert pending_count(queue) == 200 - len(closed)
    assert {str(o.pk) for o in orders if o.pk not in closed} == {
        m.decode() for shard in queue.shards for m in queue.client.zrange(shard.keys.pending, 0, -1)}


def test_sigterm_wakes_an_idle_consumer_at_once(consumer_process):
    """MAX_WAIT is an hour: only the signal can end its sleep within the test."""
    worker = consumer_process("--max-wait", "3600")
    worker.wait_until(lambda: started(worker))

    worker.signal(signal.SIGTERM)
    code, out, err = worker.wait()

    assert code == 0, err


def test_second_signal_exits_at_once_and_hands_its_claim_to_the_next(consumer_process, queue):
    """Each delivery takes 30 s: the batch in hand would take minutes; the second signal ends it now."""
    due_orders(5)
    worker = consumer_process("--batch-size", "5", env={"SHOP_DELAY_SECONDS": "30"})
    worker.wait_until(lambda: bool(leased_members(queue)))

    worker.signal(signal.SIGTERM)
    worker.wait_until(lambda: "finishing" in worker.err)
    worker.signal(signal.SIGTERM)
    code, _, _ = worker.wait()

    assert code == 128 + signal.SIGTERM
    # Nothing closed, nothing lost: the claim is another consumer's at once, not after its lease.
    assert Order.objects.filter(status=Order.Status.UNPAID).count() == 5
    assert len(leased_members(queue)) == 5
    now = now_score(timezone.now())
    assert all(where.lease_ms <= now for where in queue.positions(leased_members(queue)).values())


def test_once_processes_everything_due_then_exits(capsys):
    due_orders(30)

    call_command("run_timeout_consumer", "--once", "--batch-size", "7")

    assert Order.objects.filter(status=Order.Status.CLOSED).count() == 30
    assert "30 closed" in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    ["--batch-size", "0"], ["--batch-size", "lots"], ["--batch-size", "100000"],
    ["--max-wait", "0"], ["--max-wait", "-1"], ["--max-wait", "soon"],
])
def test_bad_options_are_command_errors(args):
    with pytest.raises(CommandError, match=args[0]):
        call_command("run_timeout_consumer", "--once", *args)


def test_the_command_logs_beside_a_shops_own_logging_and_never_twice(consumer_process, make_order):
    """The shop configured its "shop" logger and no root handler; the command adds none to the root."""
    make_order(in_seconds=-1)

    code, out, err = consumer_process("--once", env={"LOGGING_SHOP_ONLY": "1"}).wait()

    assert code == 0, err
    assert err.count("shop: released the stock of order") == 1
    assert "INFO order_timeout close claimed=1 closed=1" in err  # the command's own handler
