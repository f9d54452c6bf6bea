"""The webhooks' far end in the benchmark: a local HTTP server that records what reaches it.

The notices rows send one webhook per closed order; this is the
target they POST to, on loopback, in the harness's process. It answers every
POST at once (``200``, empty body, connection kept alive, as the ready
``webhook()`` handler's urllib3 pool and the Celery peer's expect) and records
each request's ``Idempotency-Key`` with its arrival time (``time.time()``,
the clock the commit records use), so the harness counts lost and duplicated
deliveries and each notice's lateness after its close's commit.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Handler(BaseHTTPRequestHandler):
    # Keep-alive: one connection per client thread, as a production target would allow.
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        arrived = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        sink = self.server.sink
        sink.record(self.headers.get("Idempotency-Key") or "", arrived)
        # One write, no Date or Server header, no log line (send_response's work, unneeded here).
        self.wfile.write(b"HTTP/1.1 %d %s\r\nContent-Length: 0\r\n\r\n"
                         % (sink.status, self.responses.get(sink.status, ("",))[0].encode()))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # one line per request would be most of the work


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Up to two consumers' 32 threads each, and a Celery pool, connecting at once.
    request_queue_size = 256

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        super().__init__((sink.host, 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client killed mid-connection (the crash workload's SIGKILL) is no error of the sink's."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Sink:
    """The server, its URL, and what reached it: ``(key, arrival time)`` per request, in order."""

    def __init__(self, host: str = "127.0.0.1", status: int = 200) -> None:
        self.host = host
        # What every POST is answered with (a test makes it refuse).
        self.status = status
        self._received: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Sink:
        if self._server is None:
            self._server = _Server(self)
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="bench-sink", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the sink first"
        return f"http://{self.host}:{self._server.server_address[1]}/hooks/orders"

    def record(self, key: str, at: float) -> None:
        with self._lock:
            self._received.append((key, at))

    def received(self) -> list[tuple[str, float]]:
        with self._lock:
            return list(self._received)

    def count(self) -> int:
        with self._lock:
            return len(self._received)

    def last_arrival(self) -> float | None:
        with self._lock:
            return self._received[-1][1] if self._received else None

    def clear(self) -> None:
        with self._lock:
            self._received.clear()


_shared: Sink | None = None


def shared() -> Sink:
    """The harness's one sink, started on first use and kept for the run (rows clear it)."""
    global _shared
    if _shared is None:
        _shared = Sink().start()
    return _shared
