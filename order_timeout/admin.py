"""Admin for orders and dead letters; dead letter actions call the consumer's own services."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.db.transaction import non_atomic_requests
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _, ngettext
from django.views.decorators.http import require_POST

from .conf import settings
from .exceptions import QueueUnavailable, Refused
from .models import DeadLetter, Deadline, Notice, Order, Pause, QueueEpoch, RefusedWrite, Reminder, TimeoutOverview
from .ordermodel import get_order_model
from .reporting import overview
from .scans.giveback import GiveBack, can_give_back, resume_timers
from .timers import pausing, staff

if TYPE_CHECKING:
    from .models import RefusedWriteQuerySet


def _registered(*models: type[Model]) -> Any:
    """``admin.register``, where Django's admin is installed: importing this module never needs it
    (a shop without ``django.contrib.admin`` handles refused writes with ``order_timeout_refused``)."""
    def register(admin_class: type[admin.ModelAdmin[Any]]) -> type[admin.ModelAdmin[Any]]:
        if apps.is_installed("django.contrib.admin"):
            admin.site.register(models, admin_class)
        return admin_class

    return register


class OverdueFilter(admin.SimpleListFilter):
    """Unpaid orders past their deadline: what the consumer or the scan should have closed."""

    title = _("deadline")
    parameter_name = "deadline"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("overdue", _("Unpaid and overdue")), ("running", _("Unpaid, deadline ahead")),
                ("none", _("Unpaid, no deadline"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        unpaid = queryset.filter(queryset.model.unpaid_q())
        now = timezone.now()
        return {
            "overdue": lambda: unpaid.filter(expires_at__lte=now),
            "running": lambda: unpaid.filter(expires_at__gt=now),
            "none": lambda: unpaid.filter(expires_at__isnull=True),
        }.get(self.value() or "", lambda: queryset)()


class RefusalsAsMessagesMixin:
    """A save the app refuses (``OrderClosed``, ``StaleOrderStatus``: the deadline closed the order
    while the form was open) is an error message on the same page, never a server error.

    The form's own validation says so before the save when it can (``TimeoutOrderMixin.clean``);
    this catches the save that lost the race, after which nothing was written (the admin's
    transaction is rolled back) and the page shows the row as it is now.
    """

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict[str, Any] | None = None) -> Any:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)  # type: ignore[misc]
        except Refused as refusal:
            self.message_user(request, str(refusal), messages.ERROR)  # type: ignore[attr-defined]
            return HttpResponseRedirect(request.get_full_path())


class TimeoutOrderAdminMixin(RefusalsAsMessagesMixin):
    """Add the deadline columns, filter and read-only close fields to a shop's own order admin.

    Put it first among the bases of the admin class you already have; it
    extends your ``list_display``, ``list_filter`` and ``readonly_fields``
    rather than replacing them. For an admin registered by someone else, see
    ``extend_registered_admin``.
    """

    timeout_list_display = ("expires_at", "closed_at", "close_reason")
    # The close writes these; a form must not.
    timeout_readonly_fields = ("closed_at", "close_reason")

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = list(super().get_list_display(request))  # type: ignore[misc]
        return [*shown, *(name for name in self.timeout_list_display if name not in shown)]

    def get_list_filter(self, request: HttpRequest) -> Any:
        return [*super().get_list_filter(request), OverdueFilter]  # type: ignore[misc]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fixed = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        return [*fixed, *(name for name in self.timeout_readonly_fields if name not in fixed)]


def extend_registered_admin(model: type[Model], site: admin.AdminSite = admin.site) -> type[Any]:
    """Re-register ``model``'s existing admin with ``TimeoutOrderAdminMixin`` in front; returns it.

    For a shop whose order admin was registered by its framework or its own
    ``admin.py``: call it from an ``admin.py`` that runs after that one (an
    app listed later in ``INSTALLED_APPS``).
    """
    registered = site.get_model_admin(model)
    if isinstance(registered, TimeoutOrderAdminMixin):
        return type(registered)
    extended = type(type(registered).__name__, (TimeoutOrderAdminMixin, type(registered)), {
        "__module__": type(registered).__module__,
        "__doc__": type(registered).__doc__,
    })
    site.unregister(model)
    site.register(model, extended)
    return extended


class TimeoutOrderAdmin(TimeoutOrderAdminMixin, admin.ModelAdmin):
    """Admin for an ``AbstractTimeoutOrder`` model (the app's own ``Order``, or a copy of it)."""

    list_display = ("__str__", "status", "expires_at", "closed_at", "close_reason", "created_at")
    list_filter = ("status", "close_reason", "expires_at", "closed_at")
    date_hierarchy = "expires_at"
    # Status changes go through mark_paid() and the consumer, whose updates
    # are conditional on the row; a form could write a stale status back.
    readonly_fields = ("status", "closed_at", "close_reason", "created_at")
    search_fields = ("=id",)


# Shops with their own order model register it themselves (see docs/existing-model.md).
# Read when the admin is autodiscovered, after settings are loaded and checked.
if settings.closes_orders() and get_order_model() is Order:
    _registered(Order)(TimeoutOrderAdmin)


class ResolvedFilter(admin.SimpleListFilter):
    title = _("resolved")
    parameter_name = "resolved"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("no", _("Open")), ("yes", _("Resolved"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
        if self.value() in ("yes", "no"):
            return queryset.filter(resolved_at__isnull=self.value() == "no")
        return queryset


def _report(modeladmin: admin.ModelAdmin, request: HttpRequest, counts: Counter[str]) -> None:
    sentences = {
        "requeued": lambda n: ngettext("%d order requeued.", "%d orders requeued.", n),
        "closed": lambda n: ngettext("%d order closed.", "%d orders closed.", n),
        "settled": lambda n: ngettext(
            "%d order was already paid or closed; left as it is.",
            "%d orders were already paid or closed; left as they are.", n),
        "failed": lambda n: ngettext(
            "%d order failed to close again; see its last error.",
            "%d orders failed to close again; see their last errors.", n),
        "missing": lambda n: ngettext(
            "%d order no longer exists.", "%d orders no longer exist.", n),
        "dropped": lambda n: ngettext("%d notice dropped: it will not be delivered.",
                                      "%d notices dropped: they will not be delivered.", n),
        "not_droppable": lambda n: ngettext(
            "%d dead letter is not a notice's and was left open: requeue it or close it now.",
            "%d dead letters are not notices' and were left open: requeue them or close them now.", n),
        "busy": lambda n: ngettext(
            "%d order is locked by another transaction right now; try it again.",
            "%d orders are locked by another transaction right now; try them again.", n),
        "unrequeued": lambda n: ngettext(
            "%d order's deadline was extended, but Redis is unavailable: it was not requeued "
            "and stays a dead letter; try again.",
            "%d orders' deadlines were extended, but Redis is unavailable: they were not requeued "
            "and stay dead letters; try again.", n),
    }
    for key, sentence in sentences.items():
        if counts.get(key):
            level = messages.WARNING if key in ("failed", "missing", "busy", "unrequeued", "not_droppable") \
                else messages.SUCCESS
            modeladmin.message_user(request, sentence(counts[key]) % counts[key], level)
    if not any(counts.values()):
        modeladmin.message_user(request, _("Nothing to do: the selected dead letters are resolved."),
                                messages.INFO)


@_registered(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    list_display = ("order_id", "order_model", "timer", "attempts", "error_type", "last_failed_at",
                    "first_failed_at", "resolution", "resolved_by", "resolved_at")
    list_filter = (ResolvedFilter, "resolution", "error_type", "order_model", "timer", "last_failed_at")
    search_fields = ("=order_id", "error_type", "last_error")
    date_hierarchy = "last_failed_at"
    actions = ["requeue", "close_now", "drop"]
    readonly_fields = [field.name for field in DeadLetter._meta.fields]
    # Only those who act on dead letters read (and search) what the errors said: a message may
    # carry a row's values. Lookers see each letter's kind of error, counts and state.
    error_fields = ("last_error",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A deleted letter sends its order back to the scan, which closes it: "close now"
        # without that permission and with no record of who did it.
        return False

    def may_read_errors(self, request: HttpRequest) -> bool:
        return self.has_requeue_permission(request) or self.has_close_now_permission(request)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        return fields if self.may_read_errors(request) else [f for f in fields if f not in self.error_fields]

    def get_search_fields(self, request: HttpRequest) -> Any:
        fields = super().get_search_fields(request)
        return fields if self.may_read_errors(request) else [f for f in fields if f not in self.error_fields]

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("order_timeout.requeue_deadletter")

    def has_close_now_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("order_timeout.close_deadletter_order")

    @admin.action(description=_("Requeue the orders (closed at once if still overdue)"),
                  permissions=["requeue"])
    def requeue(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        try:
            counts = staff.requeue(queryset, request.user, timezone.now())
        except QueueUnavailable as exc:
            self.message_user(request, _("Redis is unavailable; nothing was requeued: %s") % exc,
                              messages.ERROR)
            return
        _report(self, request, counts)

    @admin.action(description=_("Close the orders now (if still unpaid)"),
                  permissions=["close_now"])
    def close_now(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        _report(self, request, staff.close_now(queryset, request.user, timezone.now()))


    @admin.action(description=_("Drop the notices (deliver them no more)"), permissions=["requeue"])
    def drop(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        _report(self, request, staff.drop(queryset, request.user, timezone.now()))


class HandledFilter(admin.SimpleListFilter):
    title = _("handled")
    parameter_name = "handled"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("no", _("Waiting for staff")), ("yes", _("Handled")), ("itself", _("Settled by itself"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[RefusedWrite]) -> QuerySet[RefusedWrite]:
        if self.value() in ("yes", "no"):
            return queryset.filter(handled_at__isnull=self.value() == "no")
        if self.value() == "itself":
            return queryset.exclude(settled_how="")
        return queryset


@_registered(RefusedWrite)
class RefusedWriteAdmin(admin.ModelAdmin):
    """The writes the app refused over a deadline's act, for staff to act on: a payment after its order
    closed, a stale copy's save over an acted-on row. The shop's own code may have taken the money (or
    committed a payment's row) before the order's write was refused: refund it, or put the order right
    the shop's own way, then mark the row handled.

    Read-only but for that action, which takes the model's change permission; never added or deleted
    here (the prune deletes the handled ones after ``DEAD_LETTER_RETENTION``).
    """

    list_display = ("at", "row", "model", "timer", "refusal", "values", "handled_at", "handled_by", "handled_note",
                    "settled_how")
    list_filter = (HandledFilter, "refusal", "timer", "model", "at")
    list_select_related = ("handled_by",)
    search_fields = ("=object_id", "=public_name")
    date_hierarchy = "at"
    actions = ["mark_handled"]
    readonly_fields = [field.name for field in RefusedWrite._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The change permission is the action's; a row's own page is for reading.
        return obj is None and super().has_change_permission(request)

    @admin.display(description=_("name"), ordering="public_name")
    def row(self, refused: RefusedWrite) -> str:
        """The refused row by the name its clients know (its key by default), linked to its page in
        this admin where it has one."""
        name = refused.public_name or refused.object_id
        url = _change_url(self.admin_site, refused.model, refused.object_id)
        return format_html('<a href="{}">{}</a>', url, name) if url else name

    @admin.action(description=_("Mark handled (refunded, or put right by staff)"), permissions=["change"])
    def mark_handled(self, request: HttpRequest, queryset: RefusedWriteQuerySet) -> None:
        marked = queryset.mark_handled(request.user, timezone.now())
        if marked:
            self.message_user(request, ngettext("%d refused write marked handled.",
                                                "%d refused writes marked handled.", marked) % marked,
                              messages.SUCCESS)
        else:
            self.message_user(request, _("Nothing to do: the selected refused writes were handled already."),
                              messages.INFO)


def _change_url(site: admin.AdminSite, label: str, object_id: str) -> str:
    """The admin page of the row ``label`` and ``object_id`` name, or "" where it has none here."""
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError):
        return ""
    if not site.is_registered(model):
        return ""
    try:
        return reverse(f"{site.name}:{model._meta.app_label}_{model._meta.model_name}_change", args=[object_id])
    except NoReverseMatch:
        return ""


class ViewOnlyAdmin(admin.ModelAdmin):
    """Staff may look, never add, change or delete: the rows are the app's own records."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@_registered(Reminder)
class ReminderAdmin(ViewOnlyAdmin):
    """The reminders done: which order, how long before which deadline, sent or passed over. Read-only:
    the rows are what keeps a reminder from going out twice."""

    list_display = ("order_id", "order_model", "seconds_before", "deadline", "outcome", "at")
    list_filter = ("outcome", "order_model", "at")
    search_fields = ("=order_id",)
    date_hierarchy = "at"

    @admin.display(description=_("seconds before the deadline"), ordering="lead_ms")
    def seconds_before(self, reminder: Reminder) -> float:
        return reminder.lead_ms / 1000


@_registered(Deadline)
class DeadlineAdmin(ViewOnlyAdmin):
    """The deadlines of rows of models the shop cannot change, one per declared timer and row. Read-only:
    ``timer.set_deadline()`` writes them, in step with Redis."""

    list_display = ("object_id", "timer", "expires_at")
    list_filter = ("timer", "expires_at")
    search_fields = ("=object_id",)
    date_hierarchy = "expires_at"


@_registered(Notice)
class NoticeAdmin(ViewOnlyAdmin):
    """The notices, delivered or not. Read-only: ``notify()`` writes them in the shop's transactions
    and the consumers deliver them; one that kept failing is a dead letter, requeued or dropped
    there. What its last attempt met (``last_error``, a target's answer) shows to those who may
    requeue dead letters: an answer may carry what the notice said."""

    list_display = ("pk", "handler", "key", "state", "due_at", "attempts", "delivered_at", "object_model",
                    "object_id")
    list_filter = ("state", "handler", "due_at")
    search_fields = ("=key", "=object_id")
    date_hierarchy = "due_at"
    private_fields = ("last_error", "last_answer", "payload")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        if request.user.has_perm("order_timeout.requeue_deadletter"):
            return fields
        return [name for name in fields if name not in self.private_fields]


@_registered(Pause)
class PauseAdmin(ViewOnlyAdmin):
    """Every pause and its resume, newest first: which timer, paused when, by whom and why, resumed when
    and by whom, and what was given back. Read-only: the record of what staff did in an outage is
    written by the pause and resume themselves (the "Order timeouts" page's forms and the commands)."""

    list_display = ("timer", "paused_at", "paused_by_whom", "reason", "resumed_at", "resumed_by_whom",
                    "seconds_given_back", "given_back_rows")
    list_filter = ("timer", "paused_at", "resumed_at")
    list_select_related = ("paused_by", "resumed_by")
    search_fields = ("timer", "reason")
    date_hierarchy = "paused_at"
    ordering = ("-paused_at", "-pk")

    @admin.display(description=_("paused by"), ordering="paused_by")
    def paused_by_whom(self, row: Pause) -> str:
        return row.paused_by.get_username() if row.paused_by is not None else str(_("a command"))

    @admin.display(description=_("resumed by"), ordering="resumed_by")
    def resumed_by_whom(self, row: Pause) -> str:
        if row.resumed_at is None:
            return ""
        return row.resumed_by.get_username() if row.resumed_by is not None else str(_("a command"))

    @admin.display(description=_("seconds given back"), ordering="given_back_seconds")
    def seconds_given_back(self, row: Pause) -> float | None:
        return None if row.given_back_seconds is None else round(row.given_back_seconds, 1)


@_registered(QueueEpoch)
class QueueEpochAdmin(ViewOnlyAdmin):
    """Each queue's epoch, and how often a consumer rebuilt it after Redis lost it."""

    list_display = ("queue", "epoch", "created_at", "rebuilt_at", "rebuilds")
    ordering = ("queue",)


@_registered(TimeoutOverview)
class TimeoutOverviewAdmin(ViewOnlyAdmin):
    """The "Order timeouts" page: how the queue is doing, for staff with its view permission.

    The model has no table, so the page and its pause box's two forms are its only URLs: the
    change, history, delete and add URLs a ModelAdmin registers would read a table that does
    not exist; without them the admin answers 404.
    """

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view  # login, staff and the CSRF check
        return [path("", view(self.changelist_view), name=f"{name}_changelist"),
                # Outside ATOMIC_REQUESTS: a give-back commits a chunk at a time, so a payment never
                # waits for the whole walk, and a walk cut short keeps what it moved.
                path("pause/", non_atomic_requests(view(require_POST(self.pause_view))), name=f"{name}_pause"),
                path("resume/", non_atomic_requests(view(require_POST(self.resume_view))), name=f"{name}_resume")]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if not self.has_view_permission(request):
            raise PermissionDenied
        may = _dead_letter_permissions(self.admin_site, request)
        letters: list[DeadLetter] = []
        open_letters = 0
        if may["requeue"] or may["close"]:
            letters = list(DeadLetter.objects.filter(resolved_at__isnull=True).order_by("pk")[:OPEN_LETTERS])
            open_letters = len(letters)
            if open_letters == OPEN_LETTERS:
                open_letters = DeadLetter.objects.filter(resolved_at__isnull=True).count()
        dead_letters_url = reverse("admin:order_timeout_deadletter_changelist") if may["view"] else ""
        figures = overview.context(request)
        context = {
            **self.admin_site.each_context(request),
            **figures,
            **self.pause_forms(request, figures["pauses"]),
            "title": _("Order timeouts"),
            "opts": self.model._meta,
            "overdue_url": _overdue_orders_url(self.admin_site, request),
            "dead_letters_url": f"{dead_letters_url}?resolved=no" if dead_letters_url else "",
            "refused_writes_url": _refused_writes_url(self.admin_site, request),
            "dead_letters_action_url": dead_letters_url,
            "dead_letters": letters,
            "open_dead_letters": open_letters,
            "can_requeue": may["requeue"],
            "can_close": may["close"],
            # A Redis error names hosts and ports: for those who act on the queue, not every looker.
            "may_read_errors": may["requeue"] or may["close"] or request.user.is_superuser,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/order_timeout/overview.html", context)

    def may_pause(self, request: HttpRequest) -> bool:
        """Pausing and resuming take a permission of their own: a pause stops every close of the shop."""
        return self.has_view_permission(request) and request.user.has_perm(PAUSE_PERMISSION)

    def pause_forms(self, request: HttpRequest, pauses: list[pausing.Paused]) -> dict[str, Any]:
        """What the pause box's forms need, for those who may use them: the timers not paused yet, and
        the paused ones a give-back can move (the checkbox shows only where it can work); and the
        link to every pause and resume, for those who may read them."""
        site = self.admin_site
        history = site.is_registered(Pause) and site.get_model_admin(Pause).has_view_permission(request)
        pauses_url = reverse(f"{site.name}:order_timeout_pause_changelist") if history else ""
        if not self.may_pause(request):
            return {"can_pause": False, "pauses_url": pauses_url}
        paused = {pause.timer for pause in pauses}
        return {
            "can_pause": True,
            "pauses_url": pauses_url,
            "pausable": [name for name in pausing.known_names() if name not in paused],
            "giving_back": [pause.timer for pause in pauses if _gives_time_back(pause.timer)],
            "give_back_grace": settings.GIVE_BACK_GRACE,
            "pause_url": reverse(self._url_name("pause")),
            "resume_url": reverse(self._url_name("resume")),
        }

    def pause_view(self, request: HttpRequest) -> HttpResponseRedirect:
        """Pause the chosen timer for the reason given, by this user: ``order_timeout_pause``'s call."""
        if not self.may_pause(request):
            raise PermissionDenied
        try:
            created = pausing.pause(request.POST.getlist("timer"), request.POST.get("reason", ""),
                                    known=pausing.known_names(), user=request.user)
        except pausing.PauseRefused as refusal:
            self.message_user(request, str(refusal), messages.ERROR)
        else:
            for row in created:
                self.message_user(request, _("Paused %(timer)s: %(reason)s. Nothing of it is claimed or acted on "
                                             "until it is resumed.") % {"timer": row.timer, "reason": row.reason},
                                  messages.SUCCESS)
        return HttpResponseRedirect(reverse(self._url_name("changelist")))

    def resume_view(self, request: HttpRequest) -> HttpResponseRedirect:
        """Resume the timer, giving the time back when the box is ticked: what ``order_timeout_resume
        [--give-back]`` does, through the same functions in the same order (every give-back refused
        before anything moves; each one run while its timer is still paused)."""
        if not self.may_pause(request):
            raise PermissionDenied
        names = request.POST.getlist("timer")
        try:
            if not names:
                raise pausing.PauseRefused("Name the timer to resume.")
            ended, given = resume_timers(names, give_time_back=bool(request.POST.get("give_back")),
                                         user=request.user)
        except pausing.PauseRefused as refusal:
            self.message_user(request, str(refusal), messages.ERROR)
        else:
            for row in ended:
                self._report_resume(request, row, given.get(row.timer))
        return HttpResponseRedirect(reverse(self._url_name("changelist")))

    def _report_resume(self, request: HttpRequest, row: Pause, back: GiveBack | None) -> None:
        values: dict[str, Any] = {"timer": row.timer, "since": formats.localize(timezone.localtime(row.paused_at)),
                                  "reason": row.reason}
        if back is None:
            self.message_user(request, _("Resumed %(timer)s, paused since %(since)s (%(reason)s): what fell due "
                                         "is acted on now.") % values, messages.SUCCESS)
            return
        assert back.until is not None
        values.update(seconds=round(back.seconds), rows=back.moved, busy=back.busy,
                      until=formats.localize(timezone.localtime(back.until)))
        self.message_user(request, ngettext(
            "Resumed %(timer)s, paused since %(since)s (%(reason)s); gave %(seconds)d s back to %(rows)d row "
            "due before %(until)s.",
            "Resumed %(timer)s, paused since %(since)s (%(reason)s); gave %(seconds)d s back to %(rows)d rows "
            "due before %(until)s.", back.moved) % values, messages.SUCCESS)
        if back.busy:
            self.message_user(request, ngettext(
                "%(timer)s: %(busy)d row was locked elsewhere (a payment being confirmed?) and kept its deadline.",
                "%(timer)s: %(busy)d rows were locked elsewhere (payments being confirmed?) and kept their "
                "deadlines.", back.busy) % values, messages.WARNING)

    def _url_name(self, view: str) -> str:
        return f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_{view}"


# Pausing and resuming timers from the page (the Pause model's own permission).
PAUSE_PERMISSION = "order_timeout.pause_timers"


def _gives_time_back(name: str) -> bool:
    """Whether a give-back can move the paused timer's deadlines (not the reminders', the notices')."""
    try:
        can_give_back(pausing.kind_named(name))
    except pausing.PauseRefused:
        return False
    return True


# The overview's buttons act on at most this many open dead letters at once (the oldest).
OPEN_LETTERS = 100


def _dead_letter_permissions(site: admin.AdminSite, request: HttpRequest) -> dict[str, bool]:
    """What the user may do with dead letters here, by the rules of their own admin.

    The buttons post to the dead letters' changelist: they need its view
    permission as well as the action's own, or they would answer 403.
    """
    if not site.is_registered(DeadLetter):
        return {"view": False, "requeue": False, "close": False}
    letters = site.get_model_admin(DeadLetter)
    view = letters.has_view_or_change_permission(request)
    # get_actions() leaves out the actions whose permissions the user lacks.
    actions = letters.get_actions(request) if view else {}
    return {"view": view, "requeue": "requeue" in actions, "close": "close_now" in actions}


def _overdue_orders_url(site: admin.AdminSite, request: HttpRequest) -> str:
    if not settings.closes_orders():
        return ""
    model = get_order_model()
    if not site.is_registered(model):
        return ""
    registered = site.get_model_admin(model)
    if not registered.has_view_or_change_permission(request):
        return ""
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return f"{url}?deadline=overdue" if isinstance(registered, TimeoutOrderAdminMixin) else url


def _refused_writes_url(site: admin.AdminSite, request: HttpRequest) -> str:
    """The refused writes waiting for staff, for a user who may see them here."""
    if not site.is_registered(RefusedWrite) or \
            not site.get_model_admin(RefusedWrite).has_view_or_change_permission(request):
        return ""
    return f"{reverse(f'{site.name}:order_timeout_refusedwrite_changelist')}?handled=no"
