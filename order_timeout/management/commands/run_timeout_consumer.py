"""``manage.py run_timeout_consumer``: parse options, build a Consumer, run it."""

from __future__ import annotations

import logging
import signal
import threading
from argparse import ArgumentTypeError
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from order_timeout.checks import TAG as OWN_CHECKS
from order_timeout.conf import MAX_BATCH_SIZE
from order_timeout.consumer import Consumer
from order_timeout.exceptions import ImmediateShutdown, OrderTimeoutError
from order_timeout.reporting.metrics import ConsumerMetrics

# prometheus-client resolves the address (getaddrinfo): "" is no address on newer releases.
ALL_INTERFACES = "0.0.0.0"
VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise ArgumentTypeError(f"must be from 1 to {MAX_BATCH_SIZE}, got {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise ArgumentTypeError(f"must be from 0 to 65535, got {value}")
    return value


class Command(BaseCommand):
    help = ("Close unpaid orders as their deadlines pass (claim -> close -> ack, until stopped). "
            "Exits 75 when a receiver keeps its thread after its batch was given up: restart it.")
    # The app's own checks (its settings, the order model, the Redis alias), not the whole
    # project's: a worker starts often (deploys, restarts after a crash), and the rest (the
    # admin's, the URLs', the templates') concern the web process, which runs them itself. On the
    # test project this is 0.6 s of a 2.3 s start.
    requires_system_checks = [OWN_CHECKS]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true",
                            help="Process everything due now, then exit.")
        parser.add_argument("--batch-size", type=batch_size, default=None,
                            help="Members claimed per batch (default: ORDER_TIMEOUT['BATCH_SIZE']).")
        parser.add_argument("--max-wait", type=seconds, default=None,
                            help="Longest idle sleep in seconds (default: ORDER_TIMEOUT['MAX_WAIT']).")
        parser.add_argument("--no-housekeeping", action="store_true",
                            help="Leave the compensation scan and the prune to the other consumers (or "
                                 "Celery beat): for a consumer on a host that must not read whole tables.")
        parser.add_argument("--metrics-port", type=port, default=None,
                            help="Serve Prometheus metrics (this consumer's counters and the "
                                 "backlog) on this port; needs the 'metrics' extra.")
        parser.add_argument("--metrics-address", default=ALL_INTERFACES,
                            help=f"Address to serve metrics on (default: {ALL_INTERFACES}, all IPv4 "
                                 "interfaces; :: for IPv6).")

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        # This process is only a consumer: leave it when a receiver is stuck for good.
        serving = options["metrics_port"] is not None
        try:
            consumer = Consumer(batch_size=options["batch_size"], max_wait=options["max_wait"],
                                exit_when_stuck=True, metrics=ConsumerMetrics(enabled=serving),
                                housekeeping=not options["no_housekeeping"],
                                # This process does nothing else: the collector's full passes between batches.
                                collects_between_batches=True)
        except ImproperlyConfigured as exc:
            raise CommandError(f"Refusing to start: {exc}") from exc
        if options["metrics_port"] is not None:
            try:
                consumer.metrics.serve(options["metrics_port"], options["metrics_address"])
            except (RuntimeError, OSError) as exc:
                raise CommandError(f"--metrics-port {options['metrics_port']}: {exc}") from exc
        self._install_signal_handlers(consumer)
        mode = "once" if options["once"] else "until stopped"
        self.stdout.write(f"Timeout consumer running {mode} (batch {consumer.batch_size}).")
        try:
            stats = consumer.run(once=options["once"])
        except OrderTimeoutError as exc:
            raise CommandError(str(exc)) from exc
        # The order close's line only where there is an order close (ORDER_MODEL is not None).
        if consumer.model is not None:
            self.stdout.write(
                f"Timeout consumer stopped: {stats.closed} closed, {stats.skipped_paid} skipped (paid or "
                f"closed before), {stats.held} held (payment in flight), {stats.rescheduled} rescheduled, "
                f"{stats.failed} failed, "
                f"{stats.dead_lettered} dead-lettered, {stats.dropped} dropped, {stats.abandoned} given up."
            )
        else:
            self.stdout.write(f"Timeout consumer stopped after {stats.batches} batch(es).")
        # Every other kind it served, in its own words (the reminders: "sent"; a timer: "acted").
        for name, totals in stats.kinds.items():
            if name != "":
                figures = ", ".join(f"{value} {field.replace('_', ' ')}" for field, value in totals.named().items())
                self.stdout.write(f"  {totals.kind.label}: {figures}.")

    def _configure_logging(self, verbosity: int) -> None:
        """Show the app's lines when the project shows none; never touch the root logger.

        A project that configured logging keeps its handlers and formats (and
        its own loggers print once); one that did not gets a handler on the
        ``order_timeout`` logger alone.
        """
        logger = logging.getLogger("order_timeout")
        logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        if logger.handlers or logging.getLogger().handlers:
            return
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False

    def _install_signal_handlers(self, consumer: Consumer) -> None:
        received: list[int] = []

        def stop(signum: int, frame: FrameType | None) -> None:
            if received:
                # Second signal: leave now. Whatever was claimed is rolled back,
                # and its leases go to the other consumers' next claims at once.
                raise ImmediateShutdown(128 + signum)
            received.append(signum)
            self.stderr.write(f"Received {signal.Signals(signum).name}; finishing the batch in hand.")
            # Not consumer.request_stop() here: the handler runs in the main
            # thread, which may hold the Event's lock inside wait(), and that
            # lock is not reentrant. A thread takes it once the handler returns.
            threading.Thread(target=consumer.request_stop, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
