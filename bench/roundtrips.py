"""Round trips to a server, counted on the wire: a loopback proxy in front of it.

    with RoundTrips("127.0.0.1", 3306) as trips:    # a port of its own on 127.0.0.1
        ... connect to trips.port, work ...
        trips.count                                 # round trips so far, every connection

A round trip is a request the client sends after the server last answered:
the client speaking again once it has heard something back. Each answer is
held back ``delay`` seconds before the client gets it, so that what a client
sends without waiting (a pipeline's next statement, after a BEGIN it did not
wait for) reaches the server before that answer reaches the client, and is
counted with the trip it rode; only a client that waited for an answer speaks
after it. Statements sent together (a multi-statement query, a pipeline)
count once, however many packets carry them; a BEGIN the client waits for
counts as its own trip. The same count for any protocol (MariaDB's,
PostgreSQL's, Redis's), without a hook in any driver. For tests and the
benchmark's counts only: every trip takes ``delay`` longer.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

BUFFER = 1 << 16
# How long each answer is held back: far longer than a client takes between two sends it does
# not wait between, far shorter than anything that times a batch out.
DELAY = 0.01


class RoundTrips:
    """A proxy from ``127.0.0.1:port`` (a free port) to ``host:port``, counting round trips."""

    def __init__(self, host: str, port: int, delay: float = DELAY) -> None:
        self.target = (host, port)
        self.delay = delay
        self.count = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False

    def __enter__(self) -> RoundTrips:
        threading.Thread(target=self._accept, name="roundtrips-accept", daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def reset(self) -> int:
        """The count so far, and start again from zero."""
        with self._lock:
            counted, self.count = self.count, 0
        return counted

    def close(self) -> None:
        self._closed = True
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _address = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            # Whether the server spoke since the client last did: then the client's next words
            # are a new trip. True at first: the client's first request is one (a server that
            # greets first, as MariaDB's does, sets it again before the client answers).
            answered = [True]
            threading.Thread(target=self._pump, args=(client, server, answered, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, answered, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answered: list[bool], asking: bool) -> None:
        try:
            while True:
                data = source.recv(BUFFER)
                if not data:
                    break
                if not asking:
                    time.sleep(self.delay)
                with self._lock:
                    if asking and answered[0]:
                        self.count += 1
                    answered[0] = not asking
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
