"""``manage.py order_timeout_refused``: the refused writes, for staff without Django's admin.

    manage.py order_timeout_refused [--state open|handled|settled|all] [--timer NAME ...] [--json]
    manage.py order_timeout_refused --handle ID [ID ...] --note "Refunded: PSP ref 7731" [--by USERNAME]

Lists the writes the app refused over a deadline's act (a payment after its order closed, a stale
copy's save over an acted-on row), newest first, and marks them handled with a note. First it marks
settled by themselves those whose rows reached what they tried (scans/refusals.py): the shop's own
late payment went through, nothing is left to do.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from order_timeout.models import RefusedWrite
from order_timeout.scans import refusals

STATES = ("open", "handled", "settled", "all")


def state_of(row: RefusedWrite) -> str:
    if row.handled_at is None:
        return "open"
    return "settled" if row.settled_by_itself else "handled"


def as_dict(row: RefusedWrite) -> dict[str, Any]:
    return {"id": row.pk, "at": row.at.isoformat(), "model": row.model, "object_id": row.object_id,
            "name": row.public_name or row.object_id, "timer": row.timer, "refusal": row.refusal,
            "values": row.values, "state": state_of(row),
            "handled_at": row.handled_at.isoformat() if row.handled_at else None,
            "handled_by": row.handled_by.get_username() if row.handled_by else None,
            "note": row.handled_note, "settled_how": row.settled_how}


def _at(moment: Any) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}"


def as_lines(row: RefusedWrite) -> list[str]:
    name = row.public_name or row.object_id
    head = (f"#{row.pk}  {_at(row.at)}  {row.model} {name} (pk {row.object_id})  timer {row.timer or '-'}  "
            f"{row.refusal}  {state_of(row)}")
    lines = [head, f"    tried to write: {json.dumps(row.values, sort_keys=True)}"]
    if row.settled_by_itself:
        lines.append(f"    settled by itself at {_at(row.handled_at)}: {row.settled_how}")
    elif row.handled_at is not None:
        who = row.handled_by.get_username() if row.handled_by else "someone"
        note = f": {row.handled_note}" if row.handled_note else ""
        lines.append(f"    handled at {_at(row.handled_at)} by {who}{note}")
    return lines


class Command(BaseCommand):
    help = ("List the writes the app refused over a deadline's act (newest first), or mark some handled "
            "with a note: for staff without Django's admin. Those whose rows reached what they tried "
            "(a late payment that went through the shop's own path) are marked settled by themselves first.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--state", choices=STATES, default="open",
                            help="Which to list: open (waiting for staff, the default), handled (by staff), "
                                 "settled (by themselves), all.")
        parser.add_argument("--timer", action="append", metavar="NAME",
                            help="Only this timer's (close for the order close); give it again for more.")
        parser.add_argument("--limit", type=int, default=50, help="At most this many (default 50).")
        parser.add_argument("--json", action="store_true", help="A JSON list, one object per refused write.")
        parser.add_argument("--handle", type=int, nargs="+", metavar="ID",
                            help="Mark these refused writes handled (with --note) instead of listing.")
        parser.add_argument("--note", default="", help="With --handle: what was done (a refund's reference).")
        parser.add_argument("--by", metavar="USERNAME", help="With --handle: the staff user who did it.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1.")
        if options["handle"] is None and (options["note"] or options["by"]):
            raise CommandError("--note and --by go with --handle ID ...")
        refusals.settle()
        if options["handle"] is not None:
            self._mark_handled(options["handle"], options["note"].strip(), options["by"])
            return
        rows = RefusedWrite.objects.select_related("handled_by").order_by("-at", "-pk")
        rows = {"open": rows.open(), "handled": rows.filter(handled_at__isnull=False, settled_how=""),
                "settled": rows.exclude(settled_how=""), "all": rows}[options["state"]]
        if options["timer"]:
            rows = rows.filter(timer__in=options["timer"])
        shown = list(rows[:options["limit"]])
        if options["json"]:
            self.stdout.write(json.dumps([as_dict(row) for row in shown], indent=2))
            return
        for row in shown:
            self.stdout.write("\n".join(as_lines(row)))
        total = rows.count()
        more = f" (the newest {len(shown)} shown: --limit)" if total > len(shown) else ""
        which = "" if options["state"] == "all" else f" {options['state']}"
        self.stdout.write(f"{total}{which} refused write(s){more}")

    def _mark_handled(self, ids: list[int], note: str, username: str | None) -> None:
        if not note:
            raise CommandError("Say what was done with --note (a refund's reference): staff after you read it.")
        user = None
        if username:
            try:
                user = get_user_model()._default_manager.get_by_natural_key(username)
            except get_user_model().DoesNotExist as exc:
                raise CommandError(f"No user {username!r}.") from exc
        found = {row.pk: row for row in RefusedWrite.objects.filter(pk__in=ids).select_related("handled_by")}
        missing = sorted(set(ids) - set(found))
        if missing:
            raise CommandError(f"No refused write {', '.join(f'#{pk}' for pk in missing)}: nothing was marked.")
        now = timezone.now()
        for pk in ids:
            row = found[pk]
            if RefusedWrite.objects.filter(pk=pk).mark_handled(user, now, note):
                self.stdout.write(f"#{pk} {row.model} {row.public_name or row.object_id}: marked handled: {note}")
            else:
                self.stdout.write(f"#{pk} {row.model} {row.public_name or row.object_id}: left as it was, "
                                  f"{state_of(row)} already at {_at(row.handled_at)}")
