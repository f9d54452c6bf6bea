"""The four systems under test: how an order enters each, and how its closers run.

Every system closes the same ``order_timeout.Order`` rows and sends the same
``order_expired`` signal; they differ in how a deadline is stored and found.
One more row runs this project on the test shop's own ``ShopOrder``, whose
receiver writes a status-change row per close: what the shop-style path costs;
and a floor of its own (``floor_shop``) does the same statements with nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.db import transaction
from django_redis import get_redis_connection

from order_timeout import schedule
from order_timeout.models import Order
from order_timeout.timers.members import deadline_score

from .baselines import SEED_KEY
from .floor import STATUS_CHANGES_ENV

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 5000
# Ids of the idle workload's stand-in orders: far above any real row.
FAKE_PK = 10**9


class System:
    name = ""
    label = ""
    processes = 2
    # Who closes: for the table.
    closers = ""
    # Seconds to create one order and make it known to the system, to place the first deadline
    # after production (times 1.5): a burst still being published when it falls due measures the
    # publisher, not the closers (the table says by how much it overran). 60 us overran by up to
    # 4 s on a loaded 2-vCPU VM.
    enqueue_seconds = 0.0001
    # Where its pending orders wait, for the memory column.
    memory = "redis"
    # The order model its closers close, and what its closers' processes need to know of it.
    model_label = "order_timeout.Order"
    extra_env: dict[str, str] = {}
    # Whether its closers record their commits from ``order_keys_expired`` (a batch's keys, as the
    # floor does) rather than from an ``order_expired`` receiver per order (bench/recorder.py).
    records_keys = False
    # The idle workload only tells something new for a new way of waiting; the crash workload
    # (bench/crash.py) runs last, on closers of its own.
    workloads: tuple[str, ...] = ("idle", "steady", "burst", "crash")
    # How a crashed closer and a lost broker (Redis) affect it, for the crash table: what the
    # crash workload measures, and what it cannot (the broker's loss).
    crash_note: str = ""
    # Whether ``--quick`` runs its crash workload too (our variants share ours' lease path: full run only).
    crash_in_quick = True
    # Whether the create-transaction measure applies (it creates order_timeout.Order rows).
    measures_create = True
    # Share of the burst's orders held by a payment in flight (only ``OursHeld``).
    held_share = 0.0
    # Where its closers' code lives: this checkout, or another ref's worktree (``--compare``).
    root = ROOT
    # Smaller workloads for a row that publishes or closes a hundred times slower than ours (a
    # peer): at most these sizes (``Sizes`` fields), said in its row. Its closes/s, lateness and
    # CPU per close are rates, so they still read against the others'.
    limits: dict[str, float] = {}
    # Only in the full run (the peers, bench/peers): ``--quick`` leaves it out unless named.
    full_only = False
    # The databases it runs on (a queue of PostgreSQL's own runs on PostgreSQL only).
    vendors: tuple[str, ...] = ("mysql", "postgresql")
    # The notices rows (bench/notices.py): one webhook per closed order to the harness's
    # sink (bench/sink.py), which the harness waits for after the closes and counts.
    delivers_notices = False
    # The crash workloads it runs: (the result's name, the closer killed, what it is), each a
    # crash burst of its own (bench/crash.py).
    crash_victims: tuple[tuple[str, int, str], ...] = (("crash", 0, "a closer"),)
    # The same, the closer frozen (SIGSTOP, a paused VM) instead, and never restarted: thawed
    # once the wait ends. Ours only (its variants share its path).
    crash_freezes: tuple[tuple[str, int, str], ...] = ()
    # Whether the crash workload's other variant applies: its Redis emptied (FLUSHDB, as a restart
    # without persistence leaves it) once a third is closed, no closer killed (``lose_redis``).
    loses_redis = False

    def sized(self, sizes: Any) -> Any:
        """``sizes`` within this row's ``limits``."""
        from dataclasses import replace

        return replace(sizes, **{name: min(getattr(sizes, name), limit) for name, limit in self.limits.items()})

    @property
    def model(self) -> Any:
        from django.apps import apps

        return apps.get_model(self.model_label)

    def __init__(self, record_dir: Path) -> None:
        self.record_dir = record_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        # Each running closer's command and stderr file, by its place in ``procs``.
        self.commands_run: list[list[str]] = []
        self.proc_logs: list[Path] = []
        self.logs: list[Path] = []
        # Added to every closer's environment by ``start`` (the crash workload's eager records).
        self.phase_env: dict[str, str] = {}
        self.env: dict[str, str] = {}
        # What closers that exited badly printed last (stderr tails).
        self.errors: list[str] = []
        # The closers ``freeze_one`` stopped, by their place in ``procs``.
        self.frozen: list[int] = []

    # -- orders in ------------------------------------------------------

    def enqueue(self, orders: Sequence[Order]) -> None:
        """Make freshly bulk-created orders known to this system."""

    def enqueue_on_commit(self, order: Order) -> None:
        """What this system adds to an order's create transaction."""

    def hold_far_future(self, count: int) -> None:
        """Put ``count`` orders due in an hour into the system (idle workload), cheaply."""

    def hold(self, orders: Sequence[Order]) -> set[int]:
        """Give some of a burst's orders a payment in flight; their ids (none but for ``OursHeld``)."""
        return set()

    def without_held(self, orders: Any) -> Any:
        """The queryset ``orders`` less those ``hold`` held (none but for ``OursHeld``)."""
        return orders

    def forget_far_future(self) -> None:
        """Take the idle workload's orders out again, before the timed workloads."""

    # -- closers --------------------------------------------------------

    def commands(self) -> list[list[str]]:
        raise NotImplementedError

    def start(self) -> None:
        # Persistent connections for every closer: Celery's Django fixup would
        # otherwise reconnect after every task, and that is not what we measure.
        # SHOP_NOTICES=0: no notice of the shop's own (its e-mail per close) but in the notices rows.
        self.env = {**os.environ, "BENCH": "1", "SHOP_RECORD_EXPIRIES": "0", "SHOP_RECORD_REMINDERS": "0",
                    "SHOP_TIMERS": "0", "SHOP_NOTICES": "0", "CONN_MAX_AGE": "600",
                    "BENCH_RECORD_DIR": str(self.record_dir), "PYTHONPATH": str(self.root),
                    "ORDER_TIMEOUT_ORDER_MODEL": self.model_label,
                    "BENCH_RECORD_KEYS": "1" if self.records_keys else "0", **self.extra_env, **self.phase_env}
        for command in self.commands():
            proc, log = self._launch(command)
            self.procs.append(proc)
            self.commands_run.append(command)
            self.proc_logs.append(log)
        time.sleep(self.startup_seconds)

    startup_seconds = 2.0

    def _launch(self, command: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        # A file, not a pipe: a chatty closer must never block on a full pipe.
        log = self.record_dir / f"stderr-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as err:
            return subprocess.Popen(command, cwd=self.root, env=self.env, stdout=subprocess.DEVNULL,
                                    stderr=err), log

    def restart_one(self, index: int) -> None:
        """SIGKILL closer ``index`` and every process below it (a worker's pool), then run its
        command again at once, as a supervisor (systemd ``Restart=always``) would."""
        from .measure import process_tree

        proc = self.procs[index]
        for pid in process_tree(proc.pid):  # the parent first: it forks no new child then
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        self.procs[index], self.proc_logs[index] = self._launch(self.commands_run[index])

    def lose_redis(self) -> None:
        """Empty the Redis database it keeps its queue in (a system with ``loses_redis``)."""
        from .ownership import keep_mark

        client = get_redis_connection("order_timeout")
        client.flushdb()
        keep_mark(client)

    def freeze_one(self, index: int) -> None:
        """SIGSTOP closer ``index`` and every process below it, until ``thaw()``."""
        self._signal_tree(index, signal.SIGSTOP)
        self.frozen.append(index)

    def thaw(self) -> None:
        for index in self.frozen:
            self._signal_tree(index, signal.SIGCONT)
        self.frozen = []

    def _signal_tree(self, index: int, signum: int) -> None:
        from .measure import process_tree

        for pid in process_tree(self.procs[index].pid):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def in_flight(self) -> int:
        """Orders its queue still holds for a closer that may close them (again) later: the
        crash workload waits for these as well as for the unpaid rows. None but for ours."""
        return 0

    def busy(self, victim: int = 0) -> bool:
        """Whether every closer holds work now, so that the one the crash workload kills (closer
        ``victim``) loses some (it kills once this is true and a third of its burst is closed)."""
        return True

    def stop(self) -> None:
        """SIGTERM every closer and wait: they write their commit records on the way out."""
        self.thaw()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in zip(self.procs, self.proc_logs, strict=True):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.returncode not in (0, -signal.SIGTERM):
                self.errors.append(log.read_bytes()[-2000:].decode(errors="replace"))
        self.procs, self.commands_run, self.proc_logs = [], [], []

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    # -- notices (delivers_notices) --------------------------------------

    @property
    def sink(self) -> Any:
        """The harness's webhook sink (bench/sink.py), started on first use."""
        from .sink import shared

        return shared()

    def notices_pending(self) -> int:
        """Notices it still holds, to be delivered later (rows not yet delivered, tasks in a broker)."""
        return 0

    def memory_pids(self) -> list[int]:
        """The processes whose memory holds its pending orders, for the idle memory column: its
        closers' (a broker's, for a peer whose delays wait in the broker)."""
        return self.pids()


class Ours(System):
    name, label = "ours", "django-order-timeout"
    closers = "2 consumers, batch 500"
    batch = "500"
    crash_note = ("Crash: the killed consumer's heartbeat runs out (HEARTBEAT_SECONDS, 1.5 s) and the other "
                  "consumer's next beat hands its leases over; the next claim takes its batch over whole "
                  "and closes it under the row lock: late by about 2 s, never lost, whatever LEASE_SECONDS "
                  "says; a batch committed before the kill but not acked is taken over too, and the row "
                  "re-check stops its second close. Frozen: the same, and the consumer that finds it dead "
                  "ends its database session, so its row locks go. Redis lost (restarted empty, a replica "
                  "that missed the last writes): the rows are the truth; a consumer's beat finds the "
                  "queue's epoch marker gone or stamped by another server and rebuilds the queue from the "
                  "rows at once, no beat needed.")
    crash_freezes: tuple[tuple[str, int, str], ...] = (("crash_frozen", 0, "a consumer"),)
    loses_redis = True
    # The benchmark's recorder takes the batch's keys: the row pays for no receiver of its own.
    records_keys = True

    def commands(self) -> list[list[str]]:
        # BENCH_CONSUMER_VERBOSITY=1 logs every batch (with its time) to the closers' stderr files.
        verbosity = os.environ.get("BENCH_CONSUMER_VERBOSITY", "0")
        return [[sys.executable, "manage.py", "run_timeout_consumer", "-v", verbosity,
                 "--batch-size", self.batch, *self._skip_checks()] for _ in range(self.consumers or self.processes)]

    def _skip_checks(self) -> list[str]:
        """The quick crash's short lease (2 s) trips check E020 with the test shop's e-mail notice
        handlers (a 10 s timeout, more than half a lease), declared whether or not notices are on,
        and a consumer refuses to start on a check error. No row here but ours_notices writes a
        notice, and it keeps the default lease: skip the checks under a shortened lease only."""
        return ["--skip-checks"] if "ORDER_TIMEOUT_LEASE_SECONDS" in self.phase_env else []

    def enqueue(self, orders: Sequence[Order]) -> None:
        for start in range(0, len(orders), CHUNK):
            with transaction.atomic():
                schedule(orders[start:start + CHUNK])

    def enqueue_on_commit(self, order: Order) -> None:
        pass  # the app's own post_save receiver does it

    def forget_far_future(self) -> None:
        from order_timeout.queue import TimeoutQueue

        queue = TimeoutQueue.from_settings()
        queue.client.delete(*(shard.keys.pending for shard in queue.shards))

    # Of its closers, the consumers (None: all; the Celery notices peer adds a worker).
    consumers: int | None = None

    def busy(self, victim: int = 0) -> bool:
        """More than a batch leased: every consumer holds members (a batch it closes, or one it
        committed and has not acked yet), so the one killed leaves some to take over. One ZCARD
        a shard: the crash workload asks every few ms, and our batches take tens of ms."""
        from order_timeout.queue import TimeoutQueue

        queue = TimeoutQueue.from_settings()
        leased = sum(queue.client.zcard(shard.keys.leased) for shard in queue.shards)
        return leased > ((self.consumers or self.processes) - 1) * int(self.batch)

    def in_flight(self) -> int:
        """Members still leased: a killed consumer's, until they are taken over and acked."""
        from django.utils import timezone

        from order_timeout.queue import TimeoutQueue
        from order_timeout.timers.members import now_score

        return TimeoutQueue.from_settings().stats(now_score(timezone.now())).leased

    def hold_far_future(self, count: int) -> None:
        from order_timeout.queue import TimeoutQueue

        queue = TimeoutQueue.from_settings()
        score = deadline_score(_in_an_hour())
        for start in range(FAKE_PK, FAKE_PK + count, CHUNK):
            queue.schedule({str(pk): score for pk in range(start, min(start + CHUNK, FAKE_PK + count))})


class OursPerOrder(Ours):
    """Ours with the benchmark's recorder as an ``order_expired`` receiver, per order: what a shop's
    per-order receiver costs (an instance per order, a send per order), as every row paid before
    the lean close (1c9ce2a)."""

    name, label = "ours_per_order", "django-order-timeout, an order_expired receiver per order"
    records_keys = False
    workloads = ("burst",)
    measures_create = False
    crash_in_quick = False
    crash_freezes = ()
    loses_redis = False


class OursNotices(Ours):
    """Ours with one webhook notice per closed order: the shop's ``orders_expired``
    receiver writes them (one INSERT per batch, in the close's transaction) and the consumers
    deliver them, a claim's worth (``DELIVERIES_AT_ONCE``) at once on as many threads, to the
    harness's sink."""

    name, label = "ours_notices", "django-order-timeout, close + one webhook notice per order"
    closers = "2 consumers, batch 500; notices 32 a claim, 32 threads a consumer"
    # The webhook alone (SHOP_EMAIL_NOTICES=0: no e-mail notice); each order recorded at its
    # COMMIT, as the Celery peer's are (bench/recorder.py).
    extra_env = {"SHOP_NOTICES": "1", "SHOP_EMAIL_NOTICES": "0", "BENCH_RECORD_AT_COMMIT": "1"}
    records_keys = False  # recorded at COMMIT per order, as the Celery notices peer is
    workloads = ("steady", "burst", "crash")
    measures_create = False
    crash_in_quick = False
    delivers_notices = True
    crash_freezes = ()
    loses_redis = False
    crash_note = ("As ours for the closes. The notices are rows written in the close's transaction: a batch "
                  "killed before its COMMIT leaves none (its takeover writes them once); one killed after it "
                  "leaves them pending, announced a lease late in Redis, delivered then; a consumer killed "
                  "between a POST and marking it delivered leaves it pending and leased: delivered again after "
                  "the takeover, with the same key (counted as a duplicate). Redis lost: the rows stay pending "
                  "and the scan schedules them again.")

    def start(self) -> None:
        self.extra_env = {**type(self).extra_env, "SHOP_WEBHOOK_URL": self.sink.url}
        super().start()

    def notices_pending(self) -> int:
        from order_timeout.models import Notice

        return Notice.objects.filter(state=Notice.State.PENDING).count()

    def in_flight(self) -> int:
        """Members leased, and notices not yet delivered: the crash workload waits for both."""
        return super().in_flight() + self.notices_pending()


class OursShop(Ours):
    """Our consumers on the shop's own order model, running the shop's close in a receiver."""

    name, label = "ours_shop", "django-order-timeout, shop model (a status-change row per close)"
    model_label = "shop.ShopOrder"
    # The shop's status-change receiver only: no stock lines in this workload.
    extra_env = {"SHOP_RELEASE_STOCK": "0"}
    workloads = ("steady", "burst", "crash")
    measures_create = False
    crash_in_quick = False
    crash_freezes = ()
    loses_redis = False
    crash_note = ("As ours: the status-change row is written in the close's transaction, so a killed "
                  "batch rolls back with its rows and the takeover writes them once.")


class OursShopBatch(OursShop):
    """The same shop close, written by ``orders_expired`` receivers: one INSERT of the batch's
    status-change rows and one UPDATE of its stock, per batch (docs/existing-model.md)."""

    name, label = ("ours_shop_batch",
                   "django-order-timeout, shop model, batch receivers (orders_expired)")
    extra_env = {**OursShop.extra_env, "SHOP_BATCH_RECEIVERS": "1"}
    crash_note = ("As ours: the batch's status-change rows are written in its transaction, so a killed "
                  "batch leaves none and the takeover writes them once.")


class OursReminders(Ours):
    """Ours with one reminder per order (``REMINDERS``), falling due among the closes."""

    name, label = "ours_reminders", "django-order-timeout, one reminder per order"
    # A second before each deadline: the reminders interleave with the closes of the steady
    # stream, and in the burst all fall due a second before the closes.
    reminder_seconds = 1.0
    extra_env = {"ORDER_TIMEOUT_REMINDERS": "1.0"}
    enqueue_seconds = 0.00015  # two members per order: its close and its reminder
    workloads = ("steady", "burst", "crash")
    measures_create = False
    crash_in_quick = False
    crash_freezes = ()
    loses_redis = False
    crash_note = ("As ours, for the reminders too: a killed batch of reminders is taken over after "
                  "LEASE_SECONDS and the sent reminder's row, written under the row lock, stops a second "
                  "send. Redis lost: the scan puts the missing reminders back.")

    def enqueue(self, orders: Sequence[Order]) -> None:
        from django.conf import settings
        from django.test import override_settings

        with override_settings(ORDER_TIMEOUT={**settings.ORDER_TIMEOUT,
                                              "REMINDERS": [self.reminder_seconds]}):
            super().enqueue(orders)


class OursHeld(Ours):
    """Ours with a hold condition, and a tenth of the burst's orders held by a pending payment:
    what the holds cost the others' closes (held orders stay open, and out of the figures)."""

    name, label = "ours_held", "django-order-timeout, 10 % of the burst held (payment in flight)"
    held_share = 0.1
    extra_env = {"ORDER_TIMEOUT_HOLD_CONDITION": "testproject.shop.payments.in_flight"}
    workloads = ("burst", "crash")
    measures_create = False
    crash_in_quick = False
    crash_freezes = ()
    loses_redis = False
    crash_note = "As ours (its crash burst holds no order)."

    def hold(self, orders: Sequence[Order]) -> set[int]:
        from testproject.shop.models import OrderPayment

        held = orders[::round(1 / self.held_share)]
        OrderPayment.objects.bulk_create([OrderPayment(order=order) for order in held])
        return {order.pk for order in held}

    def without_held(self, orders: Any) -> Any:
        """Less the orders held, told by the condition its consumers hold them by (a payment in
        flight), not by their ids: the harness polls this every 0.25 s, and an id list of the
        burst's 10,000 held orders was 40 kB of SQL to compile each time, on the closers' CPUs."""
        from django.utils.module_loading import import_string

        return orders.exclude(import_string(self.extra_env["ORDER_TIMEOUT_HOLD_CONDITION"])())


class Floor(System):
    """The least work that closes a due order here (``bench/floor.py``): what ratios are taken to."""

    name, label = "floor", "floor: Lua claim + one UPDATE per batch, nothing else"
    closers = "2 processes, batch 500, raw driver"
    workloads = ("steady", "burst", "crash")
    measures_create = False
    crash_note = ("Promises nothing: its claim deletes the batch from the set (ZREM), so a batch the "
                  "killed process held is never closed. Redis lost: every pending order is lost.")
    loses_redis = True

    def commands(self) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.floor"] for _ in range(self.processes)]

    def enqueue(self, orders: Sequence[Order]) -> None:
        from .floor import FLOOR_KEY

        client = get_redis_connection("order_timeout")
        for start in range(0, len(orders), CHUNK):
            client.zadd(FLOOR_KEY, {str(o.pk): deadline_score(o.expires_at)
                                    for o in orders[start:start + CHUNK] if o.expires_at is not None})


class FloorShop(Floor):
    """The floor on the shop's ``ShopOrder``, doing after its UPDATE what the shop's batch receiver
    does for the same rows (one INSERT of their status-change rows, ``bench/floor.py``): the shop
    batch row's own floor, so that row is held to the app's share of its close."""

    name, label = "floor_shop", "floor on the shop model + the shop's batch receiver's INSERT"
    closers = "2 processes, batch 500, raw driver, UPDATE + INSERT per batch"
    model_label = OursShopBatch.model_label
    extra_env = {STATUS_CHANGES_ENV: "1"}
    # The shop batch row's own, to be read against it.
    workloads = OursShopBatch.workloads
    crash_in_quick = OursShopBatch.crash_in_quick
    loses_redis = False
    crash_note = ("As the floor: the batch the killed process held is never closed (its status-change rows "
                  "commit with its UPDATE, so none are written either).")


class Polling(System):
    name, label = "polling", "seeds: poll the table every 1 s"
    closers = "1 job (as the seeds run it), 1 tx per order"
    processes = 1
    memory = "table"
    crash_note = ("The table is the truth: a killed poller's transaction rolls back and the restarted one "
                  "finds its orders again; late by the restart (one process: nothing closes meanwhile). "
                  "No broker to lose.")

    def commands(self) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.baselines", "polling"]]


class SeedZset(System):
    name, label = "seed_zset", "seeds: ZSET + Lua ZREM claim, 1 s poll"
    closers = "2 pollers, claim 200, 1 tx per order"
    crash_note = ("Delete-on-claim (ZRANGEBYSCORE + ZREM): the up to 200 orders the killed poller had "
                  "claimed and not closed are never closed; the seeds have no scan. Redis lost: every "
                  "pending order is never closed.")
    loses_redis = True

    def commands(self) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.baselines", "seed_zset"]
                for _ in range(self.processes)]

    def enqueue(self, orders: Sequence[Order]) -> None:
        client = get_redis_connection("order_timeout")
        for start in range(0, len(orders), CHUNK):
            client.zadd(SEED_KEY, {str(o.pk): deadline_score(o.expires_at)
                                   for o in orders[start:start + CHUNK] if o.expires_at is not None})

    def enqueue_on_commit(self, order: Order) -> None:
        client = get_redis_connection("order_timeout")
        deadline = order.expires_at
        assert deadline is not None  # the harness gives every order one
        transaction.on_commit(lambda: client.zadd(SEED_KEY, {str(order.pk): deadline_score(deadline)}))

    def forget_far_future(self) -> None:
        get_redis_connection("order_timeout").delete(SEED_KEY)

    def hold_far_future(self, count: int) -> None:
        client = get_redis_connection("order_timeout")
        score = deadline_score(_in_an_hour())
        for start in range(FAKE_PK, FAKE_PK + count, CHUNK):
            client.zadd(SEED_KEY, {str(pk): score for pk in range(start, min(start + CHUNK, FAKE_PK + count))})


class CeleryEta(System):
    name, label = "celery_eta", "Celery: apply_async(eta=deadline) per order"
    closers = "1 worker, prefork pool of 2, 1 tx per order"
    startup_seconds = 4.0
    processes = 1
    enqueue_seconds = 0.0012
    memory = "worker"
    crash_note = ("ETA tasks wait in the worker's memory, unacked: killed, they come back only when the "
                  "Redis broker redelivers them after visibility_timeout (3600 s here, bench/celery_eta.py), "
                  "an hour late; the up to 2 tasks running (acked on start) are lost. Redis lost: every "
                  "task not yet fetched is lost; nothing finds them again.")
    loses_redis = True

    def lose_redis(self) -> None:
        """Its broker's database: the tasks wait there (and in the worker, fetched)."""
        from .broker import flush_broker

        flush_broker()

    def commands(self) -> list[list[str]]:
        # Prefork, Celery's default pool: the solo pool fires ETA timers in steps
        # of ten per loop turn (about 20 tasks/s here), which would be unfair.
        return [[sys.executable, "-m", "celery", "-A", "bench.celery_eta", "worker",
                 "--pool=prefork", "--concurrency=2", "-Q", "bench_eta", "--loglevel=WARNING",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"]]

    def pids(self) -> list[int]:
        """The worker and its pool children: ETA tasks wait in the parent's memory."""
        pids = super().pids()
        for pid in list(pids):
            children = Path(f"/proc/{pid}/task/{pid}/children")
            if children.exists():
                pids += [int(child) for child in children.read_text().split()]
        return pids

    def enqueue(self, orders: Sequence[Order]) -> None:
        from .celery_eta import close_order

        for order in orders:
            close_order.apply_async(args=[order.pk], eta=order.expires_at)

    def enqueue_on_commit(self, order: Order) -> None:
        from .celery_eta import close_order

        transaction.on_commit(lambda: close_order.apply_async(args=[order.pk], eta=order.expires_at))

    def forget_far_future(self) -> None:
        """ETA tasks wait inside the worker: restart it on an empty broker."""
        from .broker import flush_broker

        self.stop()
        flush_broker()
        self.start()

    def hold_far_future(self, count: int) -> None:
        from .celery_eta import close_order

        eta = _in_an_hour()
        for pk in range(FAKE_PK, FAKE_PK + count):
            close_order.apply_async(args=[pk], eta=eta)


def _in_an_hour() -> Any:
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(hours=1)


def _systems() -> dict[str, type[System]]:
    from .peers import peer_systems

    return {cls.name: cls for cls in (Floor, Ours, OursPerOrder, OursReminders, OursHeld, OursShop, FloorShop,
                                      OursShopBatch, OursNotices, Polling, SeedZset, CeleryEta, *peer_systems())}


SYSTEMS: dict[str, type[System]] = _systems()
