"""A database router for projects with no order close of the app's: no ``order_timeout_order`` table.

The app ships a ready-made order model, ``order_timeout.Order``, for shops that
have none. A project whose order is a framework's, declared as a timer from
outside (Saleor's, docs/saleor.md), sets ``ORDER_TIMEOUT["ORDER_MODEL"] = None``
and lists this router, so ``migrate`` never creates that table::

    DATABASE_ROUTERS = ["order_timeout.routers.WithoutOrderTable"]

Its other tables (deadlines, dead letters, reminders) migrate as before; every
other model is left to the project's own routers.
"""

from __future__ import annotations

from typing import Any

# The app's own order model, as migrations name it.
APP_LABEL, ORDER_MODEL_NAME = "order_timeout", "order"


class WithoutOrderTable:
    """``allow_migrate``: no for ``order_timeout.Order``, no opinion on anything else."""

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        if app_label == APP_LABEL and model_name == ORDER_MODEL_NAME:
            return False
        return None


def migrates_order_table(using: str = "default") -> bool:
    """Whether the project's routers let ``migrate`` create the app's order table on ``using``."""
    from django.db import router

    return router.allow_migrate(using, APP_LABEL, model_name=ORDER_MODEL_NAME) is not False
