import os

from django.apps import AppConfig


class BenchConfig(AppConfig):
    """Installed only in benchmark processes (BENCH=1): records when each close commits, and the
    process's full garbage collections."""

    name = "bench"

    def ready(self) -> None:
        from order_timeout.signals import order_expired, order_keys_expired

        from . import recorder

        if recorder.records_keys() and recorder.eager():
            # A closer the crash workload kills: each batch stamped at its COMMIT, so a kill right after
            # it loses no record (the report comes back a moment later).
            order_keys_expired.connect(recorder.on_keys_expired, dispatch_uid="bench.recorder")
        elif recorder.records_keys():
            recorder.record_from_reports()
        else:
            order_expired.connect(recorder.receiver(), dispatch_uid="bench.recorder")
        recorder.dump_at_exit()
        # Its full garbage collections, and how many fell inside a batch (bench/gc_pauses.py).
        from . import gc_pauses

        gc_pauses.install()
        if os.environ.get("BENCH_CELERY_NOTICES") == "1":
            # The Celery notices peer (bench/peers/celery_notices.py): the shop's receiver that
            # publishes a webhook task per close from on_commit, after the recorder's.
            from .peers.celery_notices_app import on_expired

            order_expired.connect(on_expired, dispatch_uid="bench.celery_notices")
