"""The ready handlers, ``email()`` and ``webhook()``, called as the lifecycle calls them: one
``Delivery`` per attempt, a return for delivered, ``Rejected`` for refused for good, anything else
for "retry later".

The webhook talks to a real HTTP server on loopback (http.server, in a thread, HTTP/1.1 so
connections are kept alive); the e-mail goes through Django's locmem backend, or through Django's
SMTP backend to a real socket that never greets.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.mail.backends.base import BaseEmailBackend

from order_timeout import notices
from order_timeout.models import Order
from order_timeout.notices import Delivery, Rejected
from order_timeout.notices.ready import (
    ANSWER_BYTES,
    WEBHOOKS_EXTRA,
    Webhook,
    WebhookUnavailable,
    email,
    webhook,
)

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
SECRET = "whsec-test-secret"


def delivery(attempt: int = 1, *, key: str = "order-expired:42", handler: str = "test-ready", timeout: float = 2.0,
             payload: Any = None, obj: Any = None) -> Delivery:
    return Delivery(notice_id=7, handler=handler, key=key, payload={"reason": "unpaid"} if payload is None else payload,
                    attempt=attempt, object=obj, timeout=timeout)


# -- a webhook's target: a real server on loopback ------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


ANSWERS = {
    "/ok": Answer(200, b'{"ok":true}'),
    "/created": Answer(201),
    "/bad": Answer(400, b'{"error":"unknown order"}'),
    "/missing": Answer(404, b"no such hook"),
    "/request-timeout": Answer(408),
    "/too-many": Answer(429, b"slow down", {"Retry-After": "30"}),
    "/down": Answer(503, b"maintenance"),
    "/moved": Answer(302, headers={"Location": "/ok"}),
    "/long-refusal": Answer(400, b"x" * 50_000),
}


class Target(ThreadingHTTPServer):
    """Answers each path as ``ANSWERS`` says (``/slow`` only once released) and records each request."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Answering)
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.release = threading.Event()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (the slow answer's) closed its end: nothing to report


class Answering(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real target does
    timeout = 10  # an idle kept-alive connection's thread ends by itself
    server: Target

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.received.append(Received(self.path, dict(self.headers.items()), body,
                                                 self.client_address[1]))
        # Answered by the last part of the path, whatever comes before it (a shop's own URL) or after.
        route = "/" + self.path.split("?")[0].rsplit("/", 1)[-1]
        if route == "/slow":
            self.server.release.wait(10)
        answer = ANSWERS.get(route, Answer(200))
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def target() -> Iterator[Target]:
    server = Target()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def hooks() -> Iterator[Callable[..., Webhook]]:
    """``webhook()``, whose kept-alive connections are closed when the test ends."""
    made: list[Webhook] = []

    def make(*args: Any, **kwargs: Any) -> Webhook:
        made.append(webhook(*args, **kwargs))
        return made[-1]

    yield make
    for hook in made:
        hook.close()


def header(received: Received, name: str) -> str | None:
    return {key.lower(): value for key, value in received.headers.items()}.get(name.lower())


# -- webhook: what it sends -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ok", "/created"])
def test_a_2xx_answer_is_delivered(target, hooks, path):
    assert hooks(target.url(path))(delivery()) is None

    assert [received.path for received in target.received] == [path]


def test_the_default_body_names_the_notice_and_carries_its_payload(target, hooks):
    hooks(target.url("/ok"))(delivery(attempt=3))

    [received] = target.received
    assert header(received, "Content-Type") == "application/json"
    assert json.loads(received.body) == {"notice": 7, "handler": "test-ready", "key": "order-expired:42",
                                         "payload": {"reason": "unpaid"}}
    assert header(received, "X-Order-Timeout-Attempt") == "3"


def test_every_attempt_carries_the_same_idempotency_key(target, hooks):
    hook = hooks(target.url("/ok"))

    hook(delivery(attempt=1))
    hook(delivery(attempt=2))

    assert [header(received, "Idempotency-Key") for received in target.received] == ["order-expired:42"] * 2
    # The same body on every attempt (a target may check a repeated key against the first body);
    # the attempt is a header of its own.
    assert len({received.body for received in target.received}) == 1
    assert [header(received, "X-Order-Timeout-Attempt") for received in target.received] == ["1", "2"]


def test_a_key_that_is_not_printable_ascii_is_percent_encoded_in_its_header(target, hooks):
    hooks(target.url("/ok"))(delivery(key="commande expirée:42%"))

    assert header(target.received[0], "Idempotency-Key") == "commande%20expir%C3%A9e:42%25"


def test_a_signed_webhook_verifies_with_its_secret_over_the_timestamp_and_the_body(target, hooks):
    hooks(target.url("/ok"), secret=SECRET)(delivery())

    [received] = target.received
    timestamp = header(received, "X-Order-Timeout-Timestamp")
    assert timestamp is not None and abs(int(timestamp) - time.time()) < 60
    expected = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + received.body, hashlib.sha256).hexdigest()
    assert header(received, "X-Order-Timeout-Signature") == f"sha256={expected}"
    forged = hmac.new(b"another secret", f"{timestamp}.".encode() + received.body, hashlib.sha256).hexdigest()
    assert header(received, "X-Order-Timeout-Signature") != f"sha256={forged}"


def test_an_unsigned_webhook_sends_no_signature(target, hooks):
    hooks(target.url("/ok"))(delivery())

    assert header(target.received[0], "X-Order-Timeout-Signature") is None
    assert header(target.received[0], "X-Order-Timeout-Timestamp") is None


def test_the_shops_url_body_and_headers_are_used_but_cannot_replace_the_apps_headers(target, hooks):
    hook = hooks(lambda d: target.url(f"/shops/{d.payload['shop']}/ok"), secret=SECRET,
                 body=lambda d: {"event": "order.expired", "order": d.payload["order"]},
                 headers=lambda d: {"Authorization": "Bearer erp-token", "idempotency-key": "mine"})

    hook(delivery(payload={"shop": "north", "order": 42}))

    [received] = target.received
    assert received.path == "/shops/north/ok"
    assert json.loads(received.body) == {"event": "order.expired", "order": 42}
    assert header(received, "Authorization") == "Bearer erp-token"
    assert header(received, "Idempotency-Key") == "order-expired:42"


# -- webhook: what each answer means --------------------------------------------------------------


@pytest.mark.parametrize("path, status, said", [("/bad", 400, '{"error":"unknown order"}'),
                                                ("/missing", 404, "no such hook")])
def test_a_lasting_refusal_is_rejected_with_the_answer_kept(target, hooks, path, status, said):
    with pytest.raises(Rejected) as refused:
        hooks(target.url(path))(delivery())

    assert refused.value.answer.splitlines()[0].startswith(str(status))
    assert refused.value.answer.endswith(said)
    assert f"answered {status}" in str(refused.value)


@pytest.mark.parametrize("path, status", [("/request-timeout", 408), ("/too-many", 429), ("/down", 503)])
def test_a_passing_refusal_is_retried(target, hooks, path, status):
    with pytest.raises(WebhookUnavailable, match=f"answered {status}"):
        hooks(target.url(path))(delivery())


def test_a_redirect_is_rejected_and_not_followed(target, hooks):
    with pytest.raises(Rejected, match="redirects are not followed") as refused:
        hooks(target.url("/moved"))(delivery())

    assert [received.path for received in target.received] == ["/moved"]
    assert refused.value.answer.splitlines()[:2] == ["302 Found", "Location: /ok"]


def test_an_answer_slower_than_the_timeout_is_retried_when_the_timeout_ends(target, hooks):
    started = time.monotonic()

    with pytest.raises(WebhookUnavailable, match="ReadTimeoutError") as failed:
        hooks(target.url("/slow"))(delivery(timeout=0.3))

    assert time.monotonic() - started < 3
    assert not isinstance(failed.value, Rejected)


def test_a_target_that_is_not_listening_is_retried(hooks):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]

    with pytest.raises(WebhookUnavailable, match="NewConnectionError"):
        hooks(f"http://127.0.0.1:{port}/ok")(delivery(timeout=1))


def test_a_long_refusal_keeps_its_first_10_kB_and_the_next_delivery_still_goes(target, hooks):
    hook = hooks(lambda d: target.url(d.payload["path"]))

    with pytest.raises(Rejected) as refused:
        hook(delivery(payload={"path": "/long-refusal"}))
    hook(delivery(payload={"path": "/ok"}))

    assert refused.value.answer == "400 Bad Request\n" + "x" * ANSWER_BYTES
    assert [received.path for received in target.received] == ["/long-refusal", "/ok"]


def test_what_a_failure_says_of_the_url_is_its_origin_alone_as_its_path_may_be_its_secret(target, hooks):
    with pytest.raises(Rejected) as refused:
        hooks(target.url("/T0KEN/missing?sig=s3cret"))(delivery())
    with pytest.raises(WebhookUnavailable) as failed:
        hooks(target.url("/T0KEN/down?sig=s3cret"))(delivery())

    for said in (str(refused.value), str(failed.value)):
        assert f"POST http://127.0.0.1:{target.server_address[1]} answered" in said
        assert "T0KEN" not in said and "s3cret" not in said


# -- webhook: connections -------------------------------------------------------------------------


def test_deliveries_reuse_one_kept_alive_connection(target, hooks):
    hook = hooks(target.url("/ok"))

    hook(delivery(attempt=1))
    hook(delivery(attempt=2))

    assert len({received.client_port for received in target.received}) == 1


def test_deliveries_from_many_threads_at_once_all_go_through_one_handler(target, hooks):
    hook = hooks(target.url("/ok"), secret=SECRET)
    errors: list[BaseException] = []

    def deliver(number: int) -> None:
        try:
            hook(delivery(key=f"order-expired:{number}"))
        except BaseException as exc:  # noqa: BLE001 - the test reports every failure of a thread
            errors.append(exc)

    threads = [threading.Thread(target=deliver, args=(number,)) for number in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert errors == []
    assert sorted(header(received, "Idempotency-Key") or "" for received in target.received) == \
        sorted(f"order-expired:{number}" for number in range(16))


# -- webhook: declaring it ------------------------------------------------------------------------


def test_without_urllib3_a_webhook_is_improperly_configured_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "urllib3", None)

    with pytest.raises(ImproperlyConfigured, match=r"django-order-timeout\[webhooks\]"):
        webhook("https://erp.example/hooks")


def test_the_extra_the_message_names_is_declared_and_brings_urllib3():
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    extra = WEBHOOKS_EXTRA.partition("[")[2].rstrip("]")

    assert project["name"] == WEBHOOKS_EXTRA.partition("[")[0]
    assert project["optional-dependencies"][extra] == ["urllib3>=2"]


@pytest.mark.parametrize("url", ["ftp://erp.example/hooks", "erp.example/hooks", "https://", "http://[::1", 42])
def test_a_webhook_url_must_be_http_or_https(url):
    with pytest.raises(ImproperlyConfigured, match="http"):
        webhook(url)


# -- e-mail ---------------------------------------------------------------------------------------


@pytest.fixture
def templates(settings: Any) -> None:
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [TEMPLATES_DIR]}]


@pytest.fixture
def mail(settings: Any, templates: None, mailoutbox: list[Any]) -> list[Any]:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "Shop <orders@shop.example>"
    return mailoutbox


def expired_email(**kwargs: Any) -> Any:
    return email(**{"subject_template": "notices/order_expired_subject.txt",
                    "body_template": "notices/order_expired_body.txt",
                    "to": lambda d: [f"customer-{d.object.pk}@example.com"], **kwargs})


def test_the_email_renders_the_shops_templates_for_the_delivery(mail):
    expired_email(html_template="notices/order_expired_body.html")(delivery(obj=Order(pk=42)))

    [sent] = mail
    assert sent.subject == "Your order 42 has expired"
    assert sent.body == "Hello,\n\nyour order 42 was not paid in time (attempt 1).\nReason: unpaid\n"
    assert sent.alternatives == [("<p>Your order <b>42</b> has expired: unpaid</p>\n", "text/html")]
    assert sent.to == ["customer-42@example.com"]
    assert sent.from_email == "Shop <orders@shop.example>"


def test_a_plain_email_has_no_html_alternative_and_takes_its_own_from_and_a_fixed_list(mail):
    email(subject_template="notices/order_expired_subject.txt", body_template="notices/order_expired_body.txt",
          to=["ops@shop.example", "audit@shop.example"], from_email="robot@ops.shop.example")(
        delivery(obj=Order(pk=42)))

    [sent] = mail
    assert sent.alternatives == []
    assert sent.to == ["ops@shop.example", "audit@shop.example"]
    assert sent.from_email == "robot@ops.shop.example"
    assert sent.message()["Message-ID"] == "<test-ready.order-expired=3A42@ops.shop.example>"


def test_the_message_id_is_the_same_on_every_attempt_and_names_the_handler_and_the_key(mail):
    send = expired_email()

    send(delivery(attempt=1, obj=Order(pk=42)))
    send(delivery(attempt=2, obj=Order(pk=42)))
    send(delivery(attempt=1, obj=Order(pk=42), handler="test-other"))

    assert [sent.message()["Message-ID"] for sent in mail] == [
        "<test-ready.order-expired=3A42@shop.example>", "<test-ready.order-expired=3A42@shop.example>",
        "<test-other.order-expired=3A42@shop.example>"]


def test_the_message_id_takes_the_domain_it_is_given_and_stays_short_for_a_long_key(mail):
    send = expired_email(message_id_domain="mail.shop.example")

    send(delivery(obj=Order(pk=42), key="é" * 255))

    digest = hashlib.sha256(("test-ready\n" + "é" * 255).encode()).hexdigest()
    assert mail[0].message()["Message-ID"] == f"<sha256.{digest}@mail.shop.example>"


@pytest.mark.parametrize("to", [[], [""], None, lambda d: [], lambda d: [d.object.email]],
                         ids=["empty", "blank", "none", "callable-empty", "callable-blank"])
def test_an_email_with_nobody_to_send_to_is_rejected(mail, to):
    blank = type("Customer", (), {"email": ""})()

    with pytest.raises(Rejected, match="no address"):
        expired_email(to=to)(delivery(obj=blank))

    assert mail == []


def test_an_smtp_server_that_never_greets_fails_the_attempt_within_its_timeout(settings, templates):
    with socket.socket() as silent:  # accepts connections (the kernel does) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", silent.getsockname()[1]
        settings.EMAIL_TIMEOUT = None  # so only the handler's timeout can end the wait
        started = time.monotonic()

        with pytest.raises(OSError) as failed:
            expired_email()(delivery(obj=Order(pk=42), timeout=0.3))

    assert time.monotonic() - started < 3
    assert not isinstance(failed.value, Rejected)


class StrictBackend(BaseEmailBackend):
    """A backend that takes no argument it does not know (no ``timeout``), as some third-party ones."""

    sent: list[Any] = []

    def __init__(self, fail_silently: bool = False) -> None:
        super().__init__(fail_silently=fail_silently)

    def send_messages(self, email_messages: Any) -> int:
        self.sent.extend(email_messages)
        return len(email_messages)


def test_a_backend_that_takes_no_timeout_still_sends(settings, templates):
    settings.EMAIL_BACKEND = f"{__name__}.StrictBackend"
    StrictBackend.sent.clear()

    expired_email()(delivery(obj=Order(pk=42)))

    assert [sent.to for sent in StrictBackend.sent] == [["customer-42@example.com"]]
    StrictBackend.sent.clear()


# -- declaring them -------------------------------------------------------------------------------


def test_the_ready_handlers_are_declared_through_notices_handlers_as_any_handler(mail):
    notices.handlers.declare("test-ready-email", expired_email(), timeout=5)
    try:
        declared = notices.handlers.get("test-ready-email")
        declared.send(delivery(obj=Order(pk=42), timeout=declared.timeout))
    finally:
        notices.handlers.forget("test-ready-email")

    assert "test-ready-email" not in notices.handlers.names()
    assert [sent.to for sent in mail] == [["customer-42@example.com"]]
