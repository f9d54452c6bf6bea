"""The test project (and the demo). Its Celery app loads only where Celery is installed: the
``celery`` extra is optional, and the demo's environment has none."""

from importlib.util import find_spec

if find_spec("celery") is not None:
    from .celery import app as celery_app

    __all__ = ["celery_app"]
