"""What the queue's Redis offers its user: the server's version as the scripts see it, and the app's commands.

Shops limit their Redis users with ACL rules: the common ``+@all -@dangerous``
refuses INFO and CONFIG, a least-privilege rule names every command, keys
and channels may be limited to patterns. The wake-up thread learns the
version through a script (any user the queue works for may run one), and
``check --deploy`` tries each command the app sends, in a harmless form, on
a scratch key and channel under the queue's own hash tag, so that key and
channel patterns apply as to the queue's own: a refused command shows at
deploy time, not at 3 a.m.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from .scripts import load_script_source
from .shards import TimeoutQueue

# Redis 7.0, as redis.REDIS_VERSION_NUM says it: sharded pub/sub (SPUBLISH, SSUBSCRIBE).
SHARDED_PUBSUB = 0x070000
# How long the probe waits for the server to confirm a subscription.
CONFIRM_WITHIN = 5.0


def version_num(client: Any, key: str) -> int:
    """``redis.REDIS_VERSION_NUM`` of the node that holds ``key`` (0 before Redis 7)."""
    return int(client.register_script(load_script_source("version"))(keys=[key]))


def sharded_pubsub(client: Any, key: str) -> bool:
    """Whether the node holding ``key`` has sharded pub/sub, decided as ``schedule.lua`` decides."""
    return version_num(client, key) >= SHARDED_PUBSUB


def version_text(number: int) -> str:
    return f"{number >> 16}.{(number >> 8) & 0xFF}.{number & 0xFF}"


@dataclass(frozen=True)
class Refusal:
    """A command the user may not run: as ACL rules name it, and what was refused."""

    command: str
    # "command", or "keys" / "channels" when only the queue's keys or channels are refused.
    refused: str


# "this user has no permissions to run the 'select' command": the command may be
# another than the one sent (SELECT, sent on connecting when LOCATION names a database).
_REFUSED_COMMAND = re.compile(r"run the '([^']+)' command")


def _refusal(command: str, exc: NoPermissionError) -> Refusal:
    text = str(exc)
    if "keys" in text or "channels" in text:
        return Refusal(command, "keys" if "keys" in text else "channels")
    named = _REFUSED_COMMAND.search(text)
    return Refusal(named.group(1).lower() if named else command, "command")


def _key_commands(key: str) -> list[tuple[str, tuple[Any, ...]]]:
    """Each key command the app sends (its scripts' included: a script runs them as the user), harmless."""
    return [
        ("set", ("SET", key, 1, "PX", 60_000)), ("get", ("GET", key)),
        ("pexpire", ("PEXPIRE", key, 60_000)), ("del", ("DEL", key)),
        ("zadd", ("ZADD", key, 0, "probe")), ("zscore", ("ZSCORE", key, "probe")),
        ("zmscore", ("ZMSCORE", key, "probe")), ("zrange", ("ZRANGE", key, 0, 0, "WITHSCORES")),
        ("zrangebyscore", ("ZRANGEBYSCORE", key, "-inf", "+inf", "LIMIT", 0, 1)),
        ("zcard", ("ZCARD", key)), ("zcount", ("ZCOUNT", key, "-inf", "+inf")),
        ("zscan", ("ZSCAN", key, 0)), ("zrem", ("ZREM", key, "probe")),
        ("hset", ("HSET", key, "probe", 1)), ("hsetnx", ("HSETNX", key, "probe", 1)),
        ("hget", ("HGET", key, "probe")), ("hmget", ("HMGET", key, "probe")), ("hlen", ("HLEN", key)),
        ("hincrby", ("HINCRBY", key, "probe", 1)), ("hdel", ("HDEL", key, "probe")),
    ]


def refused_commands(queue: TimeoutQueue) -> list[Refusal]:
    """The commands the app sends that the queue's Redis user may not run (on the queue's keys and channels).

    Redis errors other than a refusal (the server is down) are raised.
    """
    client = queue.client
    key = queue.shards[0].keys.probe
    refusals: list[Refusal] = []

    def attempt(command: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except NoPermissionError as exc:
            refusals.append(_refusal(command, exc))
        except ResponseError:
            pass  # a refusal is a NoPermissionError; anything else (WRONGTYPE) says the command may run
        return None

    for command, args in _key_commands(key):
        attempt(command, client.execute_command, *args)
    sha = attempt("script|load", client.script_load, load_script_source("version"))
    if sha is not None:
        attempt("evalsha", client.evalsha, sha, 1, key)
    try:
        sharded: bool | None = sharded_pubsub(client, key)
    except NoPermissionError:
        sharded = None  # no script may run: try both kinds of pub/sub
    for family in ([sharded] if sharded is not None else [True, False]):
        refusals += _pubsub_refusals(client, key, sharded=family)
    return refusals


def _pubsub_refusals(client: Any, channel: str, *, sharded: bool) -> list[Refusal]:
    """Publish, subscribe and unsubscribe on a scratch channel, as the wake-ups do."""
    publish, subscribe, unsubscribe = (("spublish", "ssubscribe", "sunsubscribe") if sharded
                                       else ("publish", "subscribe", "unsubscribe"))
    refusals: list[Refusal] = []
    try:
        getattr(client, publish)(channel, "")
    except NoPermissionError as exc:
        refusals.append(_refusal(publish, exc))
    pubsub = client.pubsub()
    try:
        for command in (subscribe, unsubscribe):
            try:
                getattr(pubsub, command)(channel)
                _confirmed(pubsub, command, sharded=sharded)
            except NoPermissionError as exc:
                refusals.append(_refusal(command, exc))
    finally:
        pubsub.close()
    return refusals


def _confirmed(pubsub: Any, command: str, *, sharded: bool) -> None:
    """Read until the server confirms ``command`` (or refuses it: NoPermissionError)."""
    deadline = time.monotonic() + CONFIRM_WITHIN
    while time.monotonic() < deadline:
        message = (pubsub.get_sharded_message(timeout=0.1) if sharded
                   else pubsub.get_message(timeout=0.1))
        if message and message.get("type") == command:
            return
