"""docs/operations.md's ``order_timeout_refused`` session, run as written: each command the block
shows, after the payment it describes, prints what the block says it prints (this run's ids and
times in place of the docs')."""

from __future__ import annotations

import io
import re
import shlex
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from order_timeout.exceptions import OrderClosed
from order_timeout.models import RefusedWrite
from testproject.shop.models import ShopOrder

from .conftest import PROJECT_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

DOC = PROJECT_ROOT / "docs" / "operations.md"
MOMENT = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+")


def session() -> list[tuple[list[str], list[str]]]:
    """(the command's arguments after ``python manage.py``, the lines it prints), in order."""
    text = DOC.read_text()
    section = text[text.index("### Refused writes without the admin"):]
    block = re.search(r"```console\n(.*?)```", section, re.DOTALL)
    assert block is not None
    steps: list[tuple[list[str], list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ python manage.py "):
            steps.append((shlex.split(line.removeprefix("$ python manage.py ")), []))
        else:
            steps[-1][1].append(line)
    return steps


def in_the_docs_terms(out: str, refused: RefusedWrite, order: ShopOrder) -> list[str]:
    """This run's output with the docs' id (#7), primary key (1042) and moment."""
    out = MOMENT.sub("2026-12-07 14:02:11 UTC", out)
    out = out.replace(f"#{refused.pk} ", "#7 ").replace(f"(pk {order.pk})", "(pk 1042)")
    return out.splitlines()


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True, ids=["ShopOrder"])
def test_the_refused_writes_session_prints_what_the_docs_show(order_model: Any, make_order: Any, consumer: Any):
    order = make_order(in_seconds=-1, number="A-1001")
    consumer().run(once=True)
    assert ShopOrder.objects.get(pk=order.pk).status == "Cancelled"
    with pytest.raises(OrderClosed):
        ShopOrder.objects.get(pk=order.pk).mark_paid()
    refused = RefusedWrite.objects.get(object_id=str(order.pk))
    User.objects.create_user("ana", is_staff=True)
    steps = session()
    assert [args[0] for args, _ in steps] == ["order_timeout_refused"] * 3

    for args, expected in steps:
        out = io.StringIO()
        call_command(*[arg.replace("7", str(refused.pk)) if arg == "7" else arg for arg in args], stdout=out)

        assert in_the_docs_terms(out.getvalue(), refused, order) == expected, args
