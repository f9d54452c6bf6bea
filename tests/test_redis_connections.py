"""How many connections a web process keeps to the queue's Redis, however many threads and requests save orders."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.db import connections

from order_timeout.models import Order
from order_timeout.queue import TimeoutQueue

pytestmark = pytest.mark.django_db(transaction=True)


def connections_to_this_database(redis_client: Any) -> int:
    """Clients of this Redis connected to the tests' database (REDIS_URL's number), whoever they are."""
    db = redis_client.connection_pool.connection_kwargs.get("db", 0)
    return sum(1 for client in redis_client.client_list() if int(client["db"]) == db)


def save_pool_size() -> int:
    """The most connections the saves' client may open: its pool's own size."""
    return int(TimeoutQueue.for_saves().client.connection_pool.max_connections)


def test_orders_saved_from_200_threads_keep_the_connections_to_redis_bounded(redis_client, queue):
    Order.objects.create()  # the process has connected already, as a web process that served a request
    before = connections_to_this_database(redis_client)

    def checkout() -> None:
        try:
            Order.objects.create()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=checkout) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert connections_to_this_database(redis_client) - before <= save_pool_size() <= 16


async def post(application: Any, path: str) -> tuple[int, bytes]:
    """One POST through Django's ASGI handler, as an ASGI server would send it."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"testserver")],
             "client": ("127.0.0.1", 40000), "server": ("testserver", 80)}
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=30)
    body = b""
    while True:
        message = await communicator.receive_output(timeout=30)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=30)
    return start["status"], body


def test_2000_asgi_checkouts_keep_the_connections_to_redis_bounded(redis_client, queue):
    application = get_asgi_application()
    Order.objects.create()
    before = connections_to_this_database(redis_client)

    async def checkouts() -> list[tuple[int, bytes]]:
        at_once = asyncio.Semaphore(50)

        async def one() -> tuple[int, bytes]:
            async with at_once:
                return await post(application, "/shop/checkout")

        return await asyncio.gather(*(one() for _ in range(2000)))

    replies = asyncio.run(checkouts())

    assert [status for status, _body in replies] == [201] * 2000
    assert len({json.loads(body)["order"] for _status, body in replies}) == 2000
    assert connections_to_this_database(redis_client) - before <= save_pool_size() <= 16
