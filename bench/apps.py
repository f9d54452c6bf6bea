from django.apps import AppConfig


class BenchConfig(AppConfig):
    """Installed only in benchmark processes (BENCH=1): records when each close commits."""

    name = "bench"

    def ready(self) -> None:
        from order_timeout.signals import order_expired

        from . import recorder

        order_expired.connect(recorder.receiver(), dispatch_uid="bench.recorder")
        recorder.dump_at_exit()
