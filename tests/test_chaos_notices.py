"""The pieces of the chaos harness's ``notices`` scenario that run outside the fault run: its sink.

The sink (``chaos/sink.py``) is the webhook target the scenario counts deliveries at: it must
agree with the app's ready ``webhook()`` handler on what a request is (its key, its body, its
signature), refuse when told, hold a request while it hands its sender to the scenario, and
tell a request cut short by its sender's death from one that arrived.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from chaos.sink import ACCEPTED, REFUSED, Sink, connection_owner, without_attempt
from order_timeout.notices import Delivery
from order_timeout.notices.ready import WebhookUnavailable, webhook


def delivery(notice_id: int = 7, attempt: int = 1) -> Delivery:
    return Delivery(notice_id=notice_id, handler="order-expired-webhook",
                    key=f"order-expired-webhook:order_timeout.order:{notice_id}", payload={"pk": str(notice_id)},
                    attempt=attempt, timeout=2.0)


def test_the_sink_records_what_the_apps_webhook_sends_and_checks_its_signature() -> None:
    with Sink(secret="s3cret") as sink:
        webhook(sink.url, secret="s3cret")(delivery())
        webhook(sink.url, secret="another")(delivery(8))
        first, second = sink.requests()
    assert (first.key, first.status, first.signed, first.accepted) == (
        "order-expired-webhook:order_timeout.order:7", ACCEPTED, True, True)
    assert first.notice == 7 and first.attempt == 1
    assert not second.signed


def test_a_refusing_sink_answers_503_and_the_webhook_raises_to_be_retried() -> None:
    with Sink() as sink:
        sink.refusing.set()
        with pytest.raises(WebhookUnavailable, match="503"):
            webhook(sink.url)(delivery())
        sink.refusing.clear()
        webhook(sink.url)(delivery(attempt=2))
        refused, accepted = sink.requests()
    assert (refused.status, refused.accepted, accepted.status, accepted.accepted) == (REFUSED, False, ACCEPTED, True)


def test_a_held_request_is_recorded_first_and_its_sender_handed_over() -> None:
    handed: list[int] = []
    with Sink(candidates=lambda: [os.getpid()], on_hold=lambda pid: handed.append(pid) or True,
              hold_seconds=0.1) as sink:
        sink.hold_next()
        webhook(sink.url)(delivery())
        webhook(sink.url)(delivery(8))
        held, after = sink.requests()
    assert handed == [os.getpid()]
    assert held.held and held.pid == os.getpid() and held.accepted
    assert not after.held


def test_a_notice_is_held_once_whatever_it_costs() -> None:
    """The scenario's kills never meet the same notice twice: each costs a takeover (MAX_TAKEOVERS)."""
    with Sink(candidates=lambda: [os.getpid()], on_hold=lambda pid: True, hold_seconds=0.0) as sink:
        sink.hold_next()
        webhook(sink.url)(delivery())
        sink.hold_next()
        webhook(sink.url)(delivery(attempt=2))
        webhook(sink.url)(delivery(8))
    assert [request.held for request in sink.requests()] == [True, False, True]


def test_a_request_cut_short_by_its_senders_death_is_neither_accepted_nor_refused() -> None:
    with Sink() as sink:
        port = int(sink.url.split(":")[2].split("/")[0])
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b"POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\n"
                        b"Content-Length: 100\r\n\r\n{\"notice\": 1")
        for _ in range(100):
            if sink.requests():
                break
            threading.Event().wait(0.02)
        [cut] = sink.requests()
    assert (cut.key, cut.complete, cut.accepted) == ("k", False, False)


def test_the_owner_of_a_loopback_connection_is_found_among_the_candidates() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        client_port, server_port = client.getsockname()[1], server.getsockname()[1]
        assert connection_owner(client_port, server_port, [os.getppid(), os.getpid()]) == os.getpid()
        assert connection_owner(client_port, server_port, [os.getppid()]) is None


def test_bodies_that_differ_only_in_their_attempt_are_told_apart() -> None:
    assert without_attempt(b'{"notice": 1, "attempt": 1}') == without_attempt(b'{"attempt": 2, "notice": 1}')
    assert without_attempt(b'{"notice": 1}') != without_attempt(b'{"notice": 2}')
