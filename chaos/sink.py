"""The webhooks' far end in the ``notices`` scenario: a local HTTP server that records what reaches it.

A ``ThreadingHTTPServer`` on loopback, in the harness's process, that the test
shop's ``order-expired-webhook`` handler POSTs to (``SHOP_WEBHOOK_URL``). It
records every request as it arrives, before it answers: its ``Idempotency-Key``,
its body (the bytes), whether its signature holds (``SHOP_WEBHOOK_SECRET``),
what it was answered, when (``time.time()``), and which process sent it (the
connection's owner, found in ``/proc``: a consumer or a scan). A request it
accepts counts as received, as a target that acts on a webhook before it
answers would count it: a sender that dies before the answer reaches it sends
it again, and that repeat is a duplicate.

Three faults are the scenarios' to turn on: ``refusing`` (every POST is
answered 503 while it is set), ``hold_next()`` (the next POST it would accept
is recorded, then held open while ``on_hold`` is called with the sending
process, which the scenario kills: a consumer SIGKILLed inside its handler) and
``answer_delay`` (every accepted POST answered that many seconds late: a slow
target).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SIGNATURE_HEADER = "X-Order-Timeout-Signature"
TIMESTAMP_HEADER = "X-Order-Timeout-Timestamp"
ATTEMPT_HEADER = "X-Order-Timeout-Attempt"
ACCEPTED, REFUSED = 200, 503
# The status recorded for a request whose body never arrived whole (it is answered nothing).
CUT_SHORT = 0


@dataclass(frozen=True)
class Request:
    """One POST that reached the sink, as it arrived."""

    key: str
    body: bytes
    status: int
    at: float
    # The process that sent it (None: it was gone before the sink looked).
    pid: int | None
    signed: bool
    # Held open while its sender was killed.
    held: bool = False
    # Its body arrived whole: a sender killed while writing it leaves a request cut short, which
    # no target would act on (it is answered nothing, and counts as neither accepted nor refused).
    complete: bool = True
    # The attempt its X-Order-Timeout-Attempt header names (the body is the same on every one).
    attempt: int | None = None

    @property
    def accepted(self) -> bool:
        return self.complete and self.status == ACCEPTED

    @property
    def notice(self) -> Any:
        """The notice id the body names (``default_body``'s ``notice``), or None."""
        return body_field(self.body, "notice")



def connection_owner(client_port: int, server_port: int, candidates: Iterable[int]) -> int | None:
    """The process among ``candidates`` holding the loopback socket ``client_port`` -> ``server_port``.

    The client's end of the connection is a row of ``/proc/net/tcp`` (local
    127.0.0.1:client_port, remote 127.0.0.1:server_port) naming its inode; the
    process is the one with a file descriptor on ``socket:[inode]``.
    """
    local, remote = f"0100007F:{client_port:04X}", f"0100007F:{server_port:04X}"
    inode = None
    try:
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                inode = fields[9]
                break
    except OSError:
        return None
    if inode is None or inode == "0":
        return None
    target = f"socket:[{inode}]"
    for pid in candidates:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
    return None


class _Handler(BaseHTTPRequestHandler):
    # Keep-alive: one connection per client thread, as the webhook handler's urllib3 pool expects.
    protocol_version = "HTTP/1.1"
    server: _Server
    _owner: int | None = None
    _looked: bool = False

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        sink = self.server.sink
        arrived = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if not self._looked:  # once per connection: its sender does not change
            self._owner = connection_owner(self.client_address[1], self.server.server_address[1], sink.candidates())
            self._looked = True
        key = self.headers.get("Idempotency-Key") or ""
        if len(body) < length:  # its sender died writing it: nobody to answer, nothing to act on
            sink.record(Request(key, body, CUT_SHORT, arrived, self._owner, False, complete=False))
            self.close_connection = True
            return
        status = REFUSED if sink.refusing.is_set() else ACCEPTED
        held = status == ACCEPTED and sink.take_hold(self._owner, body)
        attempt = self.headers.get(ATTEMPT_HEADER) or ""
        sink.record(Request(key, body, status, arrived, self._owner, sink.signed(self.headers, body), held,
                            attempt=int(attempt) if attempt.isdigit() else None))
        if held:
            assert self._owner is not None
            sink.on_hold(self._owner)
            time.sleep(sink.hold_seconds)
        elif status == ACCEPTED and sink.answer_delay:
            time.sleep(sink.answer_delay)  # a slow target: it took the notice, and answers late
        try:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except OSError:
            self.close_connection = True  # its sender died holding it: nobody to answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # one line per request would be most of the work


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Several consumers' 16 delivery threads each, reconnecting at once after a restart.
    request_queue_size = 256

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        super().__init__((sink.host, 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection its sender's death reset: expected here, and counted by the scenario


class Sink:
    """The server, its URL, its faults, and every request that reached it, in order."""

    def __init__(self, *, secret: str = "", candidates: Callable[[], Iterable[int]] = list,
                 on_hold: Callable[[int], bool] = lambda pid: False, hold_seconds: float = 0.3,
                 holdable: Callable[[int], bool] = lambda pid: True, host: str = "127.0.0.1") -> None:
        self.host = host
        self.secret = secret.encode()
        # The pids a request may come from (consumers, scans), looked through in /proc.
        self.candidates = candidates
        # Called with the sender of a held request (the scenario kills it); how long the answer waits.
        self.on_hold = on_hold
        self.hold_seconds = hold_seconds
        # Which senders may be held (consumers, not scans).
        self.holdable = holdable
        self.refusing = threading.Event()
        # Seconds an accepted request waits for its answer (a slow target; 0: at once).
        self.answer_delay = 0.0
        self._hold_armed = threading.Event()
        self._held_notices: set[Any] = set()
        self._requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> Sink:
        if self._server is None:
            self._server = _Server(self)
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="chaos-sink", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Sink:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the sink first"
        return f"http://{self.host}:{self._server.server_address[1]}/hooks/orders"

    # -- faults -------------------------------------------------------------------------------

    def hold_next(self) -> None:
        """Hold the next request this sink accepts from a holdable sender (one of a notice never
        held before), and hand its sender to ``on_hold``."""
        self._hold_armed.set()

    def take_hold(self, pid: int | None, body: bytes) -> bool:
        """Whether this request is the one to hold (and disarm)."""
        if pid is None or not self._hold_armed.is_set() or not self.holdable(pid):
            return False
        notice = body_field(body, "notice")
        with self._lock:
            if not self._hold_armed.is_set() or notice in self._held_notices:
                return False
            self._hold_armed.clear()
            self._held_notices.add(notice)
        return True

    # -- what reached it ------------------------------------------------------------------------

    def signed(self, headers: Any, body: bytes) -> bool:
        """Whether the request carries a valid signature of its body (always, without a secret)."""
        if not self.secret:
            return True
        timestamp, given = headers.get(TIMESTAMP_HEADER) or "", headers.get(SIGNATURE_HEADER) or ""
        expected = "sha256=" + hmac.new(self.secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, given)

    def record(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def last_arrival(self) -> float | None:
        with self._lock:
            return self._requests[-1].at if self._requests else None


def body_field(body: bytes, name: str) -> Any:
    """A field of a JSON object body (``default_body``'s ``notice``, ``key``, ``attempt``), or None."""
    try:
        fields = json.loads(body)
    except ValueError:
        return None
    return fields.get(name) if isinstance(fields, dict) else None


def without_attempt(body: bytes) -> bytes:
    """A webhook body with its ``attempt`` left out: what else a repeat must carry unchanged."""
    try:
        fields = json.loads(body)
    except ValueError:
        return body
    if isinstance(fields, dict):
        fields.pop("attempt", None)
    return json.dumps(fields, sort_keys=True).encode()
