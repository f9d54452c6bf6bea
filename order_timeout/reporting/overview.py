"""The figures of the admin's "Order timeouts" page: health now, and the lateness of recent closes.

Lateness comes from the rows themselves (``closed_at`` - ``expires_at`` of
orders closed by their deadline), read along the ``(status, expires_at)``
index, so the page needs no state of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import router
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _, ngettext

from ..conf import settings
from ..models import TIMEOUT_REASON, TimeoutOrderMixin
from ..ordermodel import get_order_model
from ..timers.pausing import Paused, describe, open_pauses
from .health import Health, measure, open_refused_writes
from .housekeeping import last_runs_or_none
from .storage import Storage, measure_storage

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
    # False when ORDER_MODEL is None: the page shows the timers only.
    closes_orders: bool = True
    # The app's tables and what the prune took from them.
    storage: Storage | None = None
    # Refused writes waiting for staff: read from the database alone, so shown when Redis is down too.
    refused_writes: int = 0

    @property
    def closes(self) -> int:
        return sum(minute.closes for minute in self.minutes)


def overview(now: datetime | None = None, model: type[TimeoutOrderMixin] | None = None) -> Overview:
    from ..exceptions import OrderTimeoutError
    from ..queue import TimeoutQueue

    now = now or timezone.now()
    closes_orders = model is not None or settings.closes_orders()
    model = model or (get_order_model() if closes_orders else None)
    try:
        health = measure(now, model=model, drift=False)
        drift = TimeoutQueue.from_settings().last_drift() if closes_orders else None
        error = ""
    except OrderTimeoutError as exc:
        health, drift, error = None, None, str(exc)
    return Overview(health=health, error=error, drift=drift, closes_orders=closes_orders,
                    minutes=recent_lateness(model, now) if model is not None else [], storage=measure_storage(),
                    refused_writes=health.refused_writes if health is not None else open_refused_writes())


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
    """The nearest-rank quantile: the smallest value with at least ``q`` of them at or below it.

    So the median of two closes is the faster one, and p99 of a hundred is the 99th.
    """
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), math.ceil(q * len(ordered))) - 1)]


# The chart's frame, in SVG units: the plot sits inside these margins.
CHART_WIDTH, CHART_HEIGHT = 720, 230
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 20, 30, 46
# A time label on the x axis at every quarter hour of the site's clock.
TICK_EVERY = timedelta(minutes=15)


@dataclass(frozen=True)
class _Series:
    """How one quantile is drawn."""

    name: str
    attribute: str
    colour: str
    dot_radius: float
    line_width: float
    dashes: str


# Drawn in this order: p50 over p99, whose dots are larger (a ring where the two meet)
# and whose line is dashed. The legend lists them the other way round, p50 first.
SERIES = (
    _Series("p99", "p99_s", "#ba2121", 4.0, 1.5, "5 3"),
    _Series("p50", "p50_s", "#417690", 2.5, 2.0, "none"),
)


@dataclass(frozen=True)
class _Frame:
    """Where the last hour and the lateness axis land in the SVG."""

    start: datetime
    top_s: float
    left: float = MARGIN_LEFT
    right: float = CHART_WIDTH - MARGIN_RIGHT
    top: float = MARGIN_TOP
    bottom: float = CHART_HEIGHT - MARGIN_BOTTOM

    def x(self, when: datetime) -> float:
        share = (when - self.start) / WINDOW
        return self.left + min(max(share, 0.0), 1.0) * (self.right - self.left)

    def y(self, seconds: float) -> float:
        return self.bottom - min(seconds / self.top_s, 1.0) * (self.bottom - self.top)


def lateness_svg(minutes: list[MinuteOfCloses], now: datetime) -> SafeString:
    """p50 and p99 lateness per minute over the hour ending ``now``, drawn here: no JavaScript, no build.

    The x axis is always that hour (a quiet minute is a gap, not a shorter
    axis), labelled in the site's time zone; the y axis starts at 0.
    """
    if not minutes:
        return format_html('<p class="help">{}</p>', _("No order closed by its deadline in the last hour."))
    unit, per_second = ("ms", 1000) if max(m.p99_s for m in minutes) < 1 else ("s", 1)
    step, top = _lateness_ticks(max(max(m.p99_s for m in minutes), 0.001) * per_second)
    frame = _Frame(start=now - WINDOW, top_s=top / per_second)
    parts = [
        _y_axis(frame, step, top, per_second, unit),
        _x_axis(frame, now),
        *(_series(frame, minutes, series) for series in SERIES),
        _legend(),
    ]
    return format_html(
        '<svg role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}" '
        'style="max-width: 100%; height: auto" xmlns="http://www.w3.org/2000/svg" '
        'class="order-timeout-lateness" font-size="11" fill="currentColor">{}</svg>',
        _("Close lateness per minute over the last hour, p50 and p99"),
        CHART_WIDTH, CHART_HEIGHT, CHART_WIDTH, CHART_HEIGHT,
        format_html_join("", "{}", ((part,) for part in parts)))


def _lateness_ticks(top: float) -> tuple[float, float]:
    """A round step (1, 2 or 5 times a power of ten) giving about four ticks, and the axis top."""
    rough = top / 4
    power = 10 ** math.floor(math.log10(rough))
    step = next(factor * power for factor in (1, 2, 5, 10) if factor * power >= rough * (1 - 1e-9))
    return step, step * math.ceil(round(top / step, 9))


def _y_axis(frame: _Frame, step: float, top: float, per_second: float, unit: str) -> SafeString:
    ticks = [step * n for n in range(round(top / step) + 1)]
    return format_html(
        '<g class="y-axis">{}<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" '
        'stroke-opacity="0.5"/><text class="axis-title" transform="rotate(-90)" x="{}" y="14" '
        'text-anchor="middle">{}</text></g>',
        format_html_join("", '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" '
                             'stroke-opacity="0.12"/><text class="tick" x="{}" y="{}" '
                             'text-anchor="end">{}</text>',
                         [(frame.left, f"{frame.y(v / per_second):.1f}", frame.right,
                           f"{frame.y(v / per_second):.1f}", frame.left - 6,
                           f"{frame.y(v / per_second) + 4:.1f}", f"{v:g}") for v in ticks]),
        frame.left, frame.top, frame.left, frame.bottom,
        f"{-(frame.top + frame.bottom) / 2:.1f}", _("Lateness (%(unit)s)") % {"unit": unit})


def _x_axis(frame: _Frame, now: datetime) -> SafeString:
    # Every quarter hour since the epoch is one of the site's quarter hours too:
    # time zones are offset from UTC by whole quarter hours.
    every = TICK_EVERY.total_seconds()
    first = math.ceil(frame.start.timestamp() / every) * every
    ticks = [datetime.fromtimestamp(first + n * every, tz=UTC)
             for n in range(int((now.timestamp() - first) // every) + 1)]
    return format_html(
        '<g class="x-axis"><line class="axis" x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" '
        'stroke-opacity="0.5"/>{}<text class="axis-title" x="{}" y="{}" text-anchor="middle">{}</text></g>',
        frame.left, frame.bottom, frame.right, frame.bottom,
        format_html_join("", '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" '
                             'stroke-opacity="0.5"/><text class="tick" x="{}" y="{}" '
                             'text-anchor="middle">{}</text>',
                         [(f"{frame.x(t):.1f}", frame.bottom, f"{frame.x(t):.1f}", frame.bottom + 4,
                           f"{frame.x(t):.1f}", frame.bottom + 16,
                           timezone.localtime(t).strftime("%H:%M")) for t in ticks]),
        f"{(frame.left + frame.right) / 2:.1f}", CHART_HEIGHT - 8,
        _("Time of close, last hour (%(zone)s)") % {"zone": timezone.get_current_timezone_name()})


def _series(frame: _Frame, minutes: list[MinuteOfCloses], series: _Series) -> SafeString:
    """One quantile: a line through each run of consecutive minutes, and a dot per minute."""
    runs: list[list[MinuteOfCloses]] = []
    for minute in minutes:
        if runs and minute.minute - runs[-1][-1].minute <= timedelta(minutes=1):
            runs[-1].append(minute)
        else:
            runs.append([minute])

    def point(minute: MinuteOfCloses) -> tuple[str, str]:
        return f"{frame.x(minute.minute):.1f}", f"{frame.y(getattr(minute, series.attribute)):.1f}"

    lines = format_html_join(
        "", '<polyline fill="none" stroke="{}" stroke-width="{}" stroke-dasharray="{}" points="{}"/>',
        [(series.colour, series.line_width, series.dashes, " ".join(",".join(point(m)) for m in run))
         for run in runs if len(run) > 1])
    dots = format_html_join(
        "", '<circle cx="{}" cy="{}" r="{}" fill="{}"><title>{} {}: {} ({})</title></circle>',
        [(*point(m), series.dot_radius, series.colour, timezone.localtime(m.minute).strftime("%H:%M"),
          series.name, _seconds(getattr(m, series.attribute)),
          ngettext("%(n)d close", "%(n)d closes", m.closes) % {"n": m.closes}) for m in minutes])
    return format_html('<g class="series {}">{}{}</g>', series.name, lines, dots)


def _legend() -> SafeString:
    """Top right: a swatch of each series' line, then its name."""
    right = CHART_WIDTH - MARGIN_RIGHT
    return format_html('<g class="legend">{}</g>', format_html_join(
        "", '<line x1="{}" y1="14" x2="{}" y2="14" stroke="{}" stroke-width="{}" stroke-dasharray="{}"/>'
            '<text x="{}" y="18">{}</text>',
        [(right - 120 + 60 * n, right - 100 + 60 * n, series.colour, series.line_width, series.dashes,
          right - 95 + 60 * n, series.name)
         for n, series in enumerate(reversed(SERIES))]))


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def paused_timers() -> list[Paused]:
    """The timers staff paused, oldest pause first: the page's top box, read from the database (where
    a pause lives) so it shows even when Redis cannot be read."""
    return sorted((describe(row) for row in open_pauses().values()), key=lambda pause: pause.since)


def context(request: Any, now: datetime | None = None) -> dict[str, Any]:
    """What the template shows."""
    now = now or timezone.now()
    data = overview(now)
    return {"overview": data, "chart": lateness_svg(data.minutes, now=now), "pauses": paused_timers(),
            "housekeeping": last_runs_or_none()}
