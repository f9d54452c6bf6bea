"""The admin and its messages in Simplified Chinese: the catalogue is whole, compiled and shipped.

The catalogue is ``order_timeout/locale/zh_Hans/LC_MESSAGES/django.po``, made by
``makemessages`` from inside the package (see ``test_the_catalogue_has_every_string_the_app_marks``)
and compiled by ``compilemessages``. testproject has no LocaleMiddleware, so ``LANGUAGE_CODE``
decides the language of a request.
"""

from __future__ import annotations

import ast
import gettext
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone, translation
from packaging.requirements import Requirement

from order_timeout.models import DeadLetter, Reminder

from .conftest import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "order_timeout"
MESSAGES = PACKAGE / "locale" / "zh_Hans" / "LC_MESSAGES"
PO, MO = MESSAGES / "django.po", MESSAGES / "django.mo"

OVERVIEW = "admin:order_timeout_timeoutoverview_changelist"
DEAD_LETTERS = "admin:order_timeout_deadletter_changelist"
REMINDERS = "admin:order_timeout_reminder_changelist"


# -- the catalogue, read as gettext writes it ----------------------------------------------

@dataclass
class Entry:
    msgid: str = ""
    msgctxt: str | None = None
    msgid_plural: str | None = None
    # msgstr of a singular entry at 0; msgstr[n] of a plural one at n.
    msgstr: dict[int, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[str | None, str, str | None]:
        return self.msgctxt, self.msgid, self.msgid_plural


KEYWORD = re.compile(r'^(msgctxt|msgid_plural|msgid|msgstr)(?:\[(\d+)\])?\s+(".*")$')


def read_po(path: Path) -> tuple[Entry, list[Entry]]:
    """The header and the entries of a .po file (obsolete ``#~`` entries left out)."""
    entries: list[Entry] = []
    entry, target = Entry(), None
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if not line.strip():
            if target is not None:
                entries.append(entry)
            entry, target = Entry(), None
        elif line.startswith("#,"):
            entry.flags.update(flag.strip() for flag in line[2:].split(","))
        elif line.startswith("#"):
            continue
        elif match := KEYWORD.match(line):
            keyword, index, text = match.groups()
            target = (keyword, int(index or 0))
            append(entry, target, ast.literal_eval(text))
        elif line.startswith('"') and target is not None:
            append(entry, target, ast.literal_eval(line))
        else:
            raise AssertionError(f"{path}: cannot read {line!r}")
    header = next(e for e in entries if e.msgid == "" and e.msgctxt is None)
    return header, [e for e in entries if e is not header]


def append(entry: Entry, target: tuple[str, int], text: str) -> None:
    keyword, index = target
    if keyword == "msgstr":
        entry.msgstr[index] = entry.msgstr.get(index, "") + text
    else:
        setattr(entry, keyword, (getattr(entry, keyword) or "") + text)


def describe(entry: Entry) -> str:
    return repr(entry.msgid) + (f" (context {entry.msgctxt!r})" if entry.msgctxt else "")


# -- the admin in Simplified Chinese -------------------------------------------------------

@pytest.fixture
def simplified_chinese() -> Iterator[None]:
    """The shop's language is zh-hans; the test's own thread speaks it too (nothing negotiates)."""
    with override_settings(LANGUAGE_CODE="zh-hans"), translation.override("zh-hans"):
        yield


def open_letter(order_id: str) -> DeadLetter:
    now = timezone.now()
    return DeadLetter.objects.create(order_model="order_timeout.Order", order_id=order_id, attempts=4,
                                     error_type="StockServiceDown", first_failed_at=now, last_failed_at=now)


class Breadcrumb(str):
    """The changelist's last breadcrumb: "&rsaquo; title" before Django 6.1, a list item after."""

    def forms(self) -> tuple[str, ...]:
        return (f"&rsaquo; {self}", f'<li aria-current="page">{self}</li>')


def breadcrumb(title: str) -> Breadcrumb:
    return Breadcrumb(title)


def _shown(text: str, page: str) -> bool:
    return any(form in page for form in text.forms()) if isinstance(text, Breadcrumb) else text in page


def assert_translated(page: str, shown: list[str], not_shown: list[str]) -> None:
    assert [text for text in shown if not _shown(text, page)] == []
    assert [text for text in not_shown if text in page] == []


@pytest.mark.django_db(transaction=True)
def test_the_overview_page_renders_in_simplified_chinese(simplified_chinese, admin_client):
    open_letter("41")

    response = admin_client.get(reverse(OVERVIEW))

    assert response.status_code == 200
    assert response.context["overview"].error == ""  # the figures, not the queue's error
    assert_translated(response.text, shown=[
        "<title>订单超时概览", "首页", "当前", "等待中（未到截止时间）", "未处理的死信",
        "关闭延迟，最近一小时（0 次关闭）", "最近一小时没有订单因超时关闭。",
        "将 1 条未处理的死信重新入队", "立即关闭这 1 个订单",
    ], not_shown=[
        "Order timeouts", "Pending (waiting for their deadline)", "Open dead letters",
        "Close lateness", "No order closed by its deadline", "Requeue the open dead letter",
        "Close its order now",
    ])


@pytest.mark.django_db(transaction=True)
def test_the_dead_letters_and_their_two_actions_read_in_simplified_chinese(simplified_chinese, admin_client):
    open_letter("41")

    response = admin_client.get(reverse(DEAD_LETTERS))

    assert response.status_code == 200
    assert_translated(response.text, shown=[
        '<option value="requeue">重新入队（仍超时的订单立即关闭）</option>',
        '<option value="close_now">立即关闭订单（仅限仍待支付的）</option>',
        breadcrumb("死信"), "以 处理状态", "未处理", "尝试次数", "错误类型", "最近失败时间",
    ], not_shown=[
        "Requeue the orders", "Close the orders now", "Open", "Resolved", "Attempts", "Error type",
    ])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("action", "message"), [
    ("requeue", "已将 1 个订单重新入队。"),
    ("close_now", "已关闭 1 个订单。"),
], ids=["requeue", "close_now"])
def test_the_dead_letter_actions_report_in_simplified_chinese(simplified_chinese, admin_client, make_order,
                                                               action, message):
    order = make_order(in_seconds=-5)
    letter = open_letter(str(order.pk))

    response = admin_client.post(reverse(DEAD_LETTERS), {"action": action, "_selected_action": [letter.pk],
                                                         "index": 0}, follow=True)

    assert response.status_code == 200
    assert [str(m) for m in response.context["messages"]] == [message]


@pytest.mark.django_db(transaction=True)
def test_an_action_on_a_vanished_order_warns_in_simplified_chinese(simplified_chinese, admin_client):
    letter = open_letter("999999999")

    response = admin_client.post(reverse(DEAD_LETTERS), {"action": "close_now", "_selected_action": [letter.pk],
                                                         "index": 0}, follow=True)

    assert [str(m) for m in response.context["messages"]] == ["1 个订单已不存在。"]


@pytest.mark.django_db(transaction=True)
def test_the_reminders_render_in_simplified_chinese(simplified_chinese, admin_client):
    now = timezone.now()
    Reminder.objects.create(order_model="order_timeout.Order", order_id="41", lead_ms=60_000,
                            deadline=now + timedelta(minutes=1), outcome=Reminder.Outcome.HELD, at=now)

    response = admin_client.get(reverse(REMINDERS))

    assert response.status_code == 200
    assert_translated(response.text, shown=[
        breadcrumb("提醒"), "截止前秒数", "截止时间", "未发送：支付进行中", "订单模型", "订单 ID",
    ], not_shown=[
        "Seconds before the deadline", "Not sent: payment in flight", "Order model", "Reminders",
    ])


# -- the catalogue and its compiled form ---------------------------------------------------

def test_every_string_of_the_catalogue_is_translated_and_none_is_fuzzy():
    header, entries = read_po(PO)

    assert "fuzzy" not in header.flags
    assert "Plural-Forms: nplurals=1; plural=0;\n" in header.msgstr[0]
    assert "Content-Type: text/plain; charset=UTF-8\n" in header.msgstr[0]
    assert entries
    assert [describe(e) for e in entries if "fuzzy" in e.flags] == []
    assert [describe(e) for e in entries if not all(e.msgstr.values())] == []
    # Chinese has one plural form: msgstr[0] alone, for every n.
    assert [describe(e) for e in entries if sorted(e.msgstr) != [0]] == []


def test_every_placeholder_of_a_string_is_kept_in_its_translation():
    placeholder = re.compile(r"%\(\w+\)[sd]|%[sd]|\{\w*\}")
    _, entries = read_po(PO)

    def placeholders(text: str) -> list[str]:
        return sorted(placeholder.findall(text))

    # The translation of a plural entry serves every n, so it keeps the plural's placeholders.
    wrong = {describe(e): e.msgstr[0] for e in entries
             if placeholders(e.msgstr[0]) != placeholders(e.msgid_plural or e.msgid)}
    assert wrong == {}


def test_the_compiled_catalogue_matches_the_po():
    header, entries = read_po(PO)
    expected: dict[object, str] = {}
    for e in entries:
        msgid = f"{e.msgctxt}\x04{e.msgid}" if e.msgctxt is not None else e.msgid
        if e.msgid_plural is None:
            expected[msgid] = e.msgstr[0]
        else:
            expected.update({(msgid, n): text for n, text in e.msgstr.items()})

    with MO.open("rb") as compiled:
        mo = gettext.GNUTranslations(compiled)

    # GNUTranslations has no public listing of its messages: its catalogue is the one place.
    catalog = {key: text for key, text in mo._catalog.items() if key != ""}  # type: ignore[attr-defined]
    assert catalog == expected
    assert mo.info()["plural-forms"] == "nplurals=1; plural=0;"
    assert [mo.plural(n) for n in (0, 1, 2, 5)] == [0, 0, 0, 0]  # type: ignore[attr-defined]


def test_the_catalogue_has_every_string_the_app_marks(tmp_path):
    """makemessages, run afresh on a copy of the package, finds nothing ours lacks (and nothing stale)."""
    missing_tools = [tool for tool in ("xgettext", "msguniq", "msgmerge") if shutil.which(tool) is None]
    if missing_tools:
        pytest.skip(f"GNU gettext is not installed ({', '.join(missing_tools)} missing): apt-get install gettext")
    copy = tmp_path / "order_timeout"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "locale"))
    (copy / "locale").mkdir()

    # -P: the copy is the working directory, and its queue.py must not stand in for the standard library's.
    made = subprocess.run(
        [sys.executable, "-P", "-m", "django", "makemessages", "-l", "zh_Hans", "--no-obsolete"],
        cwd=copy, capture_output=True, text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONPATH": str(PROJECT_ROOT)},
    )

    assert made.returncode == 0, made.stderr
    _, fresh = read_po(copy / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po")
    _, ours = read_po(PO)
    fresh_keys, our_keys = {e.key for e in fresh}, {e.key for e in ours}
    rerun = "cd order_timeout && django-admin makemessages -l zh_Hans --no-obsolete, then translate"
    assert sorted(fresh_keys - our_keys, key=str) == [], f"missing from the catalogue: {rerun}"
    assert sorted(our_keys - fresh_keys, key=str) == [], f"no longer in the source: {rerun}"


# -- the wheel -----------------------------------------------------------------------------

def build_backend_installed(pyproject: Path) -> bool:
    """Whether this interpreter already has what ``[build-system] requires`` (so no index is needed)."""
    for requirement in map(Requirement, tomllib.loads(pyproject.read_text())["build-system"]["requires"]):
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            return False
        if not requirement.specifier.contains(version, prereleases=True):
            return False
    return True


@pytest.fixture
def source_copy(tmp_path: Path) -> Iterator[Path]:
    """What the wheel is built from, copied: a build writes build/ and the egg-info beside its source."""
    copy = tmp_path / "source"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(PROJECT_ROOT / name, copy / name)
    shutil.copytree(PACKAGE, copy / "order_timeout", ignore=shutil.ignore_patterns("__pycache__"))
    yield copy
    shutil.rmtree(copy, ignore_errors=True)


@pytest.mark.slow
def test_the_wheel_ships_the_compiled_catalogue(source_copy, tmp_path):
    dist = tmp_path / "dist"
    # The venv's own setuptools when it is recent enough; else pip fetches the one pyproject asks for.
    isolation = ["--no-build-isolation"] if build_backend_installed(source_copy / "pyproject.toml") else []

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation,
                            "-w", str(dist), str(source_copy)], capture_output=True, text=True)

    assert built.returncode == 0, built.stderr
    try:
        (wheel,) = dist.glob("django_order_timeout-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            assert archive.read("order_timeout/locale/zh_Hans/LC_MESSAGES/django.mo") == MO.read_bytes()
            assert "order_timeout/locale/zh_Hans/LC_MESSAGES/django.po" in archive.namelist()
    finally:
        shutil.rmtree(dist, ignore_errors=True)
