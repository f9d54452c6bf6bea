"""The order model the settings name: ``get_order_model()``, as Django's ``get_user_model()``.

Its own module, beneath everything that needs the model (the kinds, the
scans, the reports), so that none of them imports the package's public face,
whose functions reach every layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import TimeoutOrderMixin


def get_order_model() -> type[TimeoutOrderMixin]:
    """The order model named by ``ORDER_TIMEOUT['ORDER_MODEL']`` (after ``get_user_model``)."""
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    from .conf import settings
    from .models import TimeoutOrderMixin

    label = settings.ORDER_MODEL
    if label is None:
        raise ImproperlyConfigured(
            "ORDER_TIMEOUT['ORDER_MODEL'] is None: this project has no order close (its timers, declared "
            "with order_timeout.timers, run without one)")
    try:
        model = apps.get_model(label, require_ready=False)
    except ValueError as exc:
        raise ImproperlyConfigured(
            "ORDER_TIMEOUT['ORDER_MODEL'] must be of the form 'app_label.model_name'"
        ) from exc
    except LookupError as exc:
        raise ImproperlyConfigured(
            f"ORDER_TIMEOUT['ORDER_MODEL'] refers to model {label!r} that has not been installed"
        ) from exc
    if not issubclass(model, TimeoutOrderMixin):
        raise ImproperlyConfigured(
            f"ORDER_TIMEOUT['ORDER_MODEL'] refers to {label!r}, which does not inherit "
            "order_timeout.models.TimeoutOrderMixin"
        )
    return model
