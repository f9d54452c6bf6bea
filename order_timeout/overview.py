"""The figures of the admin's "Order timeouts" page: health now, and the lateness of recent closes.

Lateness comes from the rows themselves (``closed_at`` - ``expires_at`` of
orders closed by their deadline), read along the ``(status, expires_at)``
index, so the page needs no state of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import router
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from . import get_order_model
from .health import Health, measure
from .models import TIMEOUT_REASON, TimeoutOrderMixin

# How far back the chart looks, and how many closes it reads at most.
WINDOW = timedelta(hours=1)
MOST_CLOSES = 5000


@dataclass
class MinuteOfCloses:
    minute: datetime
    closes: int
    p50_s: float
    p99_s: float
    max_s: float


@dataclass
class Overview:
    health: Health | None
    error: str = ""
    drift: int | None = None
    minutes: list[MinuteOfCloses] = field(default_factory=list)

    @property
    def closes(self) -> int:
        return sum(minute.closes for minute in self.minutes)


def overview(now: datetime | None = None, model: type[TimeoutOrderMixin] | None = None) -> Overview:
    from .exceptions import OrderTimeoutError
    from .queue import TimeoutQueue

    now = now or timezone.now()
    model = model or get_order_model()
    try:
        health = measure(now, model=model, drift=False)
        drift = TimeoutQueue.from_settings().last_drift()
        error = ""
    except OrderTimeoutError as exc:
        health, drift, error = None, None, str(exc)
    return Overview(health=health, error=error, drift=drift, minutes=recent_lateness(model, now))


def recent_lateness(model: type[TimeoutOrderMixin], now: datetime) -> list[MinuteOfCloses]:
    rows = (model._base_manager.db_manager(router.db_for_read(model))
            .filter(**{model.TIMEOUT_STATUS_FIELD: model.TIMEOUT_CLOSED_STATUS},
                    expires_at__gte=now - WINDOW, expires_at__lte=now, close_reason=TIMEOUT_REASON,
                    closed_at__isnull=False)
            .order_by("-expires_at").values_list("expires_at", "closed_at")[:MOST_CLOSES])
    by_minute: dict[datetime, list[float]] = {}
    for expires_at, closed_at in rows:
        if closed_at is None or expires_at is None:
            continue
        minute = closed_at.replace(second=0, microsecond=0)
        by_minute.setdefault(minute, []).append(max((closed_at - expires_at).total_seconds(), 0.0))
    return [MinuteOfCloses(minute, len(late), _quantile(late, 0.5), _quantile(late, 0.99), max(late))
            for minute, late in sorted(by_minute.items())]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lateness_svg(minutes: list[MinuteOfCloses], width: int = 640, height: int = 160) -> SafeString:
    """A small chart of p50 and p99 lateness per minute, drawn here: no JavaScript, no build."""
    if not minutes:
        return format_html('<p class="help">{}</p>', "No order closed by its deadline in the last hour.")
    top = max(max(m.p99_s for m in minutes), 0.001)
    start = minutes[0].minute
    span = max((minutes[-1].minute - start).total_seconds(), 60.0)

    def xy(minute: MinuteOfCloses, attribute: str) -> tuple[float, float]:
        return (40 + (minute.minute - start).total_seconds() / span * (width - 50),
                height - 20 - getattr(minute, attribute) / top * (height - 30))

    def points(attribute: str) -> str:
        return " ".join("{:.1f},{:.1f}".format(*xy(m, attribute)) for m in minutes)

    dots = format_html_join(
        "", '<circle cx="{}" cy="{}" r="2.5" fill="{}"><title>{}: {} {}</title></circle>',
        [(*(f"{v:.1f}" for v in xy(m, attribute)), colour, m.minute.strftime("%H:%M"), name,
          _seconds(getattr(m, attribute)))
         for m in minutes for attribute, colour, name in (("p50_s", "#417690", "p50"),
                                                          ("p99_s", "#ba2121", "p99"))])

    labels = format_html_join(
        "", '<text x="4" y="{}" font-size="10">{}</text>',
        [(height - 20, "0"), (14, _seconds(top))])
    return format_html(
        '<svg role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}" '
        'xmlns="http://www.w3.org/2000/svg" class="order-timeout-lateness">'
        '<line x1="40" y1="{}" x2="{}" y2="{}" stroke="#999"/>{}'
        '<polyline fill="none" stroke="#417690" stroke-width="2" points="{}"><title>p50</title></polyline>'
        '<polyline fill="none" stroke="#ba2121" stroke-width="1.5" points="{}"><title>p99</title></polyline>'
        '{}</svg>',
        "Close lateness per minute, p50 and p99", width, height, width, height,
        height - 20, width - 10, height - 20, labels, points("p50_s"), points("p99_s"), dots)


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def context(request: Any, now: datetime | None = None) -> dict[str, Any]:
    """What the template shows."""
    data = overview(now)
    return {"overview": data, "chart": lateness_svg(data.minutes)}
