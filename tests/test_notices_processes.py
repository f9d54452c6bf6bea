"""The probe of issue 26, with real consumer processes: killed right after the close's COMMIT.

Tried on bc07ed2 with an ``order_expired`` receiver e-mailing from ``transaction.on_commit()``:
after a restart every order was closed (5 of 5) and 3 of the 5 e-mails were ever sent. Here the
e-mail is a notice of the test shop (``testproject/shop/notices.py``), written in the close's
transaction; the consumer dies after the COMMIT, before any after-commit work.
"""

from __future__ import annotations

import email
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from order_timeout.models import Notice, Order

from .conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def sent_mails(folder: Path) -> list[email.message.Message]:
    """What Django's file-based e-mail backend wrote, one message a part."""
    messages = []
    for path in sorted(folder.glob("*.log")) if folder.exists() else []:
        for part in path.read_text().split("-" * 79):
            if part.strip():
                messages.append(email.message_from_string(part.strip()))
    return messages


def test_a_consumer_killed_right_after_the_closes_commit_loses_no_notice(consumer_process, tmp_path, queue):
    orders = [Order.objects.create(expires_at=timezone.now() - timedelta(seconds=1)) for _ in range(5)]
    mail = tmp_path / "mail"
    env = {"EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend", "EMAIL_FILE_PATH": str(mail),
           "ORDER_TIMEOUT_LEASE_SECONDS": "2"}

    victim = consumer_process("--batch-size", "5", env={**env, "SHOP_EXIT_AFTER_COMMIT": "1"})
    code, _out, err = victim.wait()
    assert code == 9, err
    assert Order.objects.filter(status="closed").count() == 5 and sent_mails(mail) == []
    assert Notice.objects.filter(state=Notice.State.PENDING).count() == 5

    survivor = consumer_process(env=env)
    try:
        wait_for(lambda: Notice.objects.filter(state=Notice.State.DELIVERED).count() == 5, timeout=40)
    finally:
        survivor.kill()
        print(survivor.err[-5000:])

    messages = sent_mails(mail)
    assert sorted(message["To"] for message in messages) == sorted(f"customer-{o.pk}@example.com" for o in orders)
    assert len({message["Message-ID"] for message in messages}) == 5


def test_a_handler_that_hangs_is_given_up_and_its_consumer_exits_for_its_supervisor(consumer_process, tmp_path):
    """No thread can be stopped from outside: a batch of notices still in hand a lease after its claim
    is given up, and the consumer exits 75 (EX_TEMPFAIL) for its supervisor to restart, as for a
    receiver stuck in a close. The notice stays pending, to be taken over."""
    Order.objects.create(expires_at=timezone.now() - timedelta(seconds=1))
    hung = consumer_process(env={"SHOP_HANG_IN_NOTICE": "1", "ORDER_TIMEOUT_LEASE_SECONDS": "2"})

    code, _out, err = hung.wait()

    assert code == 75, err
    assert Order.objects.filter(status="closed").count() == 1
    assert list(Notice.objects.values_list("state", "attempts")) == [(Notice.State.PENDING, 1)]
