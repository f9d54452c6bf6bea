"""The ready handlers the app ships: an e-mail from the shop's templates, and a signed JSON webhook.

Each is a factory returning the callable a shop declares::

    from order_timeout import notices
    from order_timeout.notices.ready import email, webhook

    notices.handlers.declare("order-expired-email", email(
        subject_template="shop/emails/expired_subject.txt", body_template="shop/emails/expired_body.txt",
        to=lambda delivery: [delivery.object.email]), timeout=10)
    notices.handlers.declare("order-expired-erp", webhook("https://erp.example/hooks/orders",
                                                          secret=ERP_SECRET), timeout=5)

The sending is Django's (templates, ``EmailMultiAlternatives``, the configured e-mail backend) and
urllib3's (pooled, verified HTTPS). What is left here is what a notice needs of them: a key that
is the same on every attempt, a timeout, and the answer told apart the way every handler tells it:
return when the notice is delivered, raise ``Rejected`` when the target refused it for good (a
dead letter now), raise anything else to be retried.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import json
import os
import string
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from email.utils import parseaddr
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import EmailMultiAlternatives, get_connection
from django.core.serializers.json import DjangoJSONEncoder
from django.template.loader import render_to_string
from django.utils.encoding import punycode
from django.utils.module_loading import import_string

from ..exceptions import OrderTimeoutError
from ..redaction import masked
from .delivery import Delivery, Rejected

if TYPE_CHECKING:
    from urllib3 import BaseHTTPResponse, PoolManager

# -- e-mail ---------------------------------------------------------------------------------------

# An address, a list of them, or a callable of the delivery giving either (None: nobody).
Addresses = str | Iterable[str] | None
Recipients = Addresses | Callable[[Delivery], Addresses]

# The characters a Message-ID's left part keeps as they are; every other one is written as
# ``=XX`` per UTF-8 byte (``=`` and ``.`` included, so the encoding is one-to-one and ``.`` is
# free to separate the handler from the key).
_MESSAGE_ID_KEEPS = frozenset(string.ascii_letters + string.digits + "-_+")
# Longer left parts are a hash of the key instead: a header line stays far inside SMTP's 998.
MAX_MESSAGE_ID_LEFT = 200


class Email:
    """The ``email()`` handler: renders the shop's templates for one delivery and sends them."""

    def __init__(self, *, subject_template: str, body_template: str, html_template: str | None,
                 to: Recipients, from_email: str | None, message_id_domain: str | None) -> None:
        self.subject_template = subject_template
        self.body_template = body_template
        self.html_template = html_template
        self.to = to
        self.from_email = from_email
        self.message_id_domain = message_id_domain

    def __call__(self, delivery: Delivery) -> None:
        recipients = _addresses(self.to(delivery) if callable(self.to) else self.to)
        if not recipients:
            # No retry would find an address the object does not have.
            raise Rejected(f"notice {delivery.notice_id} ({delivery.handler}): no address to send it to")
        context = {"delivery": delivery, "payload": delivery.payload, "object": delivery.object}
        # A subject is one header line: a template's line breaks (and its indents) become single spaces.
        subject = " ".join(render_to_string(self.subject_template, context).split())
        # Read at each send, never at declaration: settings may not be final when notices.py is imported.
        sender = self.from_email or django_settings.DEFAULT_FROM_EMAIL
        message = EmailMultiAlternatives(
            subject=subject, body=render_to_string(self.body_template, context), from_email=sender,
            to=recipients, headers={"Message-ID": message_id(delivery, self.message_id_domain or domain_of(sender))},
            connection=_connection(delivery.timeout))
        if self.html_template is not None:
            message.attach_alternative(render_to_string(self.html_template, context), "text/html")
        message.send()

    def __repr__(self) -> str:
        return f"email(subject_template={self.subject_template!r}, body_template={self.body_template!r})"


def email(*, subject_template: str, body_template: str, html_template: str | None = None, to: Recipients,
          from_email: str | None = None, message_id_domain: str | None = None) -> Email:
    """A handler sending one e-mail per notice, rendered from the shop's templates.

    Each template is rendered with ``delivery``, ``payload`` and ``object`` (the model instance the
    notice is about, loaded again now). ``to``: an address, a list, or a callable of the delivery
    giving either; no address at all is a ``Rejected``. ``from_email``: by default
    ``DEFAULT_FROM_EMAIL``. The Message-ID is the same on every attempt (``message_id()``), its
    domain ``message_id_domain`` or else the From address's.
    """
    for name, template in (("subject_template", subject_template), ("body_template", body_template),
                           ("html_template", html_template)):
        if template is not None and (not isinstance(template, str) or not template):
            raise ImproperlyConfigured(f"email(): {name} must be a template name, got {template!r}")
    return Email(subject_template=subject_template, body_template=body_template, html_template=html_template,
                 to=to, from_email=from_email, message_id_domain=message_id_domain)


def message_id(delivery: Delivery, domain: str) -> str:
    """``<{handler}.{key}@{domain}>``, each part kept where it is an atom's letter, ``=XX`` elsewhere.

    The same on every attempt and every host (so not Django's ``DNS_NAME``, which is the host's), so
    a mailbox that has the message already keeps one. The handler is part of it because a key is
    a notice's within its handler: two handlers' mails under one key are two messages.
    """
    left = f"{_atom(delivery.handler)}.{_atom(delivery.key)}"
    if len(left) > MAX_MESSAGE_ID_LEFT:
        left = "sha256." + hashlib.sha256(f"{delivery.handler}\n{delivery.key}".encode()).hexdigest()
    return f"<{left}@{domain}>"


def domain_of(address: str) -> str:
    """The domain of an address (``Shop <orders@shop.example>`` -> ``shop.example``), as IDNA."""
    domain = parseaddr(address)[1].rpartition("@")[2]
    if not domain:
        raise ImproperlyConfigured(f"email(): the From address {address!r} has no domain for the Message-ID: "
                                   "give email() a from_email or a message_id_domain")
    return punycode(domain)


def _atom(text: str) -> str:
    return "".join(char if char in _MESSAGE_ID_KEEPS else "".join(f"={byte:02X}" for byte in char.encode())
                   for char in text)


def _addresses(given: Addresses) -> list[str]:
    """The addresses as a list, blanks left out (an order whose e-mail is empty names nobody)."""
    if given is None:
        return []
    listed = [given] if isinstance(given, str) else list(given)
    return [address for address in listed if address]


def _connection(timeout: float) -> Any:
    """The configured backend, given the handler's timeout where it takes one (Django's SMTP
    backend does; locmem, console and most others do not, and a backend that takes no such
    argument must still send)."""
    backend = import_string(django_settings.EMAIL_BACKEND)
    if "timeout" in inspect.signature(backend).parameters:
        return get_connection(fail_silently=False, timeout=timeout)
    return get_connection(fail_silently=False)


# -- webhooks -------------------------------------------------------------------------------------

WEBHOOKS_EXTRA = "django-order-timeout[webhooks]"
SIGNATURE_HEADER = "X-Order-Timeout-Signature"
TIMESTAMP_HEADER = "X-Order-Timeout-Timestamp"
ATTEMPT_HEADER = "X-Order-Timeout-Attempt"
# Connections kept alive per target: as many as the consumer delivers at once (its pool of threads).
KEPT_ALIVE = 16
# What a refusal's answer keeps of its body for staff (the notice's last_answer holds 10,000 characters).
ANSWER_BYTES = 10_000
# The 4xx that say "not now" rather than "never" (a timeout, too many requests): retried, as a 5xx is.
RETRIED_STATUSES = frozenset({408, 429})
# The characters an Idempotency-Key keeps as they are (printable ASCII but % and space); others are %XX.
_HEADER_KEEPS = "".join(chr(code) for code in range(33, 127) if chr(code) != "%")

Url = str | Callable[[Delivery], str]
Headers = Mapping[str, str] | Callable[[Delivery], Mapping[str, str]]


class WebhookUnavailable(OrderTimeoutError):
    """The target did not take the notice now (no connection, a timeout, a 408, 429 or 5xx): retried."""


class Webhook:
    """The ``webhook()`` handler: one POST per delivery, on connections kept alive between them.

    Thread-safe: the consumer runs a batch's handlers at once on a pool of threads, and urllib3's
    PoolManager serves them all; it is made on first use in each process, so a process forked
    after a delivery does not share the parent's sockets.
    """

    def __init__(self, url: Url, *, secret: bytes | None, headers: Headers | None,
                 body: Callable[[Delivery], Any] | None) -> None:
        self.url = url
        self._secret = secret
        self.headers = headers
        self.body = body
        self._lock = threading.Lock()
        self._pool: PoolManager | None = None
        self._pool_pid = 0

    def __call__(self, delivery: Delivery) -> None:
        import urllib3

        url = _checked_url(self.url(delivery) if callable(self.url) else self.url)
        data = json.dumps(self.body(delivery) if self.body is not None else default_body(delivery),
                          cls=DjangoJSONEncoder, separators=(",", ":")).encode()
        try:
            response = self._connections().request(
                "POST", url, body=data, headers=self._headers_for(delivery, data),
                timeout=urllib3.Timeout(connect=delivery.timeout, read=delivery.timeout),
                # The app retries (and counts the attempts), and a redirect is the target's mistake.
                retries=False, redirect=False, preload_content=False)
        except urllib3.exceptions.HTTPError as exc:
            raise WebhookUnavailable(f"POST {origin_of(url)}: {type(exc).__name__}: {exc}") from exc
        judge_answer(origin_of(url), response.status, response.reason, response.headers.get("Location"),
                     _head_of(response))

    def _headers_for(self, delivery: Delivery, data: bytes) -> dict[str, str]:
        """The shop's headers, then the app's (which the shop's cannot replace: whatever the case)."""
        given = (self.headers(delivery) if callable(self.headers) else self.headers) or {}
        # The attempt goes in a header, never the body: a target that checks a repeated key against
        # the first body (the IETF idempotency-key draft's 422, many payment APIs' 409) sees the same.
        ours = {"Content-Type": "application/json", "Idempotency-Key": quote(delivery.key, safe=_HEADER_KEEPS),
                ATTEMPT_HEADER: str(delivery.attempt)}
        if self._secret is not None:
            timestamp = str(int(time.time()))
            ours[TIMESTAMP_HEADER] = timestamp
            ours[SIGNATURE_HEADER] = "sha256=" + signature(self._secret, timestamp, data)
        taken = {name.lower() for name in ours}
        return {**{name: value for name, value in given.items() if name.lower() not in taken}, **ours}

    def _connections(self) -> PoolManager:
        import urllib3

        with self._lock:
            if self._pool is None or self._pool_pid != os.getpid():
                self._pool = urllib3.PoolManager(maxsize=KEPT_ALIVE, block=False)
                self._pool_pid = os.getpid()
            return self._pool

    def close(self) -> None:
        """Close the connections kept alive (they open again on the next delivery)."""
        with self._lock:
            if self._pool is not None:
                self._pool.clear()

    def __repr__(self) -> str:
        return f"webhook({origin_of(self.url) if isinstance(self.url, str) else self.url!r})"


def webhook(url: Url, *, secret: str | bytes | None = None, headers: Headers | None = None,
            body: Callable[[Delivery], Any] | None = None) -> Webhook:
    """A handler POSTing one JSON document per notice to ``url`` (or ``url(delivery)``).

    The document is ``body(delivery)``, by default ``default_body()``. Headers: ``Content-Type:
    application/json``, ``Idempotency-Key`` (the notice's key, the same on every attempt), and with
    ``secret`` a timestamp and its signature (``signature()``); ``headers`` adds the shop's own. A
    2xx is delivered; a 408, 429, 5xx, no connection or no answer within the handler's timeout is
    retried; any other answer (a 3xx: redirects are not followed) is ``Rejected``, its status and
    first 10 kB kept. Needs urllib3: the ``webhooks`` extra.
    """
    _require_urllib3()
    if isinstance(url, str):
        _checked_url(url, error=ImproperlyConfigured)
    elif not callable(url):
        raise ImproperlyConfigured(f"webhook(): url must be an http(s) URL or a callable of the delivery, got {url!r}")
    if secret is not None and (not isinstance(secret, str | bytes) or not secret):
        raise ImproperlyConfigured("webhook(): secret must be a non-empty string (or bytes), or None for no signature")
    return Webhook(url, secret=secret.encode() if isinstance(secret, str) else secret, headers=headers, body=body)


def default_body(delivery: Delivery) -> dict[str, Any]:
    return {"notice": delivery.notice_id, "handler": delivery.handler, "key": delivery.key,
            "payload": delivery.payload}


def judge_answer(target: str, status: int, reason: str | None, location: str | None, answer: str) -> None:
    """Return for a 2xx; ``Rejected`` for an answer no retry would change (a 3xx, a 4xx but 408 and
    429), its status and body kept; ``WebhookUnavailable`` (retried) for anything else."""
    if 200 <= status < 300:
        return
    status_line = f"{status} {reason or ''}".rstrip()
    if 300 <= status < 500 and status not in RETRIED_STATUSES:
        moved = f" (to {location}: redirects are not followed)" if location else ""
        raise Rejected(f"POST {target} answered {status_line}{moved}",
                       answer="\n".join([status_line, *([f"Location: {location}"] if location else []), answer]))
    raise WebhookUnavailable(f"POST {target} answered {status_line}" + (f": {answer[:500]}" if answer else ""))


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``{timestamp}.{body}`` with the secret, as Stripe signs its events: the
    receiver recomputes it over the body bytes it got, and refuses an old timestamp (a replay)."""
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def origin_of(url: str) -> str:
    """``scheme://host[:port]``: what messages say of a URL, whose path or query often is its secret
    (a chat webhook's token), and messages are kept on notices and logged."""
    from urllib3.util import parse_url

    parsed = parse_url(url)
    return f"{parsed.scheme}://{parsed.host}" + (f":{parsed.port}" if parsed.port else "")


def _checked_url(url: Any, error: type[Exception] = ValueError) -> str:
    """``url`` if it is an http(s) URL with a host; else ``error`` (at declaration ImproperlyConfigured;
    from a shop's callable, at delivery, a ValueError: retried, then a dead letter saying why)."""
    from urllib3.util import parse_url

    if isinstance(url, str):
        try:
            parsed = parse_url(url)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.scheme in ("http", "https") and parsed.host:
            return url
    raise error(f"webhook(): the url must be an http:// or https:// URL, got {masked(repr(url))}")


def _head_of(response: BaseHTTPResponse) -> str:
    """At most ``ANSWER_BYTES`` of the answer's body, as text. Read to its end, the connection goes
    back to the pool by itself; a longer answer closes it rather than be read to its end."""
    import urllib3

    try:
        head = response.read(ANSWER_BYTES)
        if response.read(1):
            response.close()
    except (urllib3.exceptions.HTTPError, OSError):
        head = b""  # the status said what matters; the body was the target's trouble
        response.close()
    response.release_conn()
    return head.decode("utf-8", errors="replace")


def _require_urllib3() -> None:
    try:
        import urllib3
    except ImportError as exc:
        raise ImproperlyConfigured(f"webhook() needs urllib3: pip install {WEBHOOKS_EXTRA!r}") from exc
    if int(urllib3.__version__.split(".")[0]) < 2:
        raise ImproperlyConfigured(f"webhook() needs urllib3 2 or later, found {urllib3.__version__}: "
                                   f"pip install {WEBHOOKS_EXTRA!r}")

