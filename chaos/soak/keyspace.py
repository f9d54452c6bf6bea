"""The Redis side of a sample: every key of the queue's database, grouped by pattern.

A pattern is a key with what varies between queues and over time replaced: the key prefix's
hash tag (``{P}``, or ``{P:N}`` for shard N), and any part that names an instance rather than a
kind of key (digits, a long hex string, a UUID: ``*``). For each pattern: how many keys, their
members (``ZCARD``, ``HCARD``, ``SCARD``, ``LLEN``; a string counts one) and their bytes
(``MEMORY USAGE ... SAMPLES 0``: every element counted, not a sample of five). Also the
server's ``used_memory`` and its clients.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# A part of a key that names an instance: digits, 8+ hex digits, a UUID.
_INSTANCE = re.compile(r"^(?:\d+|[0-9a-fA-F]{8,}|[0-9a-fA-F-]{32,36})$")
_CARDINALITY = {"zset": "zcard", "hash": "hlen", "set": "scard", "list": "llen"}


@dataclass(frozen=True)
class KeyFigure:
    keys: int
    members: int
    bytes: int


def pattern_of(key: str, prefix: str) -> str:
    """``{prefix}:remind:pending`` -> ``{P}:remind:pending``; ``{prefix:3}:owners`` -> ``{P:N}:owners``;
    ``{prefix}:epoch:1a2b3c4d5e`` -> ``{P}:epoch:*``."""
    tag = ""
    for tagged, shown in ((f"{{{prefix}}}", "{P}"), (f"{{{prefix}:", "{P:N}")):
        if key.startswith(tagged):
            rest = key[len(tagged):]
            if shown == "{P:N}":
                shard, _, rest = rest.partition("}")
                if not shard.isdigit():
                    break
            tag, key = shown, rest
            break
    parts = ["*" if _INSTANCE.match(part) else part for part in key.split(":")]
    return tag + ":".join(parts)


def key_figures(client: Any, prefix: str) -> dict[str, KeyFigure]:
    """Every key of the client's database, by pattern (a ``SCAN``, then two pipelines)."""
    keys = list(client.scan_iter(count=1000))
    if not keys:
        return {}
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    types = [kind.decode() if isinstance(kind, bytes) else str(kind) for kind in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    for key, kind in zip(keys, types, strict=True):
        if kind in _CARDINALITY:
            getattr(pipe, _CARDINALITY[kind])(key)
        else:
            pipe.exists(key)
        pipe.memory_usage(key, samples=0)
    answers = pipe.execute()
    figures: dict[str, list[int]] = {}
    for index, (key, kind) in enumerate(zip(keys, types, strict=True)):
        if kind == "none":  # gone between the SCAN and the pipelines
            continue
        name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        totals = figures.setdefault(pattern_of(name, prefix), [0, 0, 0])
        totals[0] += 1
        totals[1] += int(answers[2 * index] or 0)
        totals[2] += int(answers[2 * index + 1] or 0)
    return {pattern: KeyFigure(*totals) for pattern, totals in sorted(figures.items())}


def server_figures(client: Any) -> dict[str, int]:
    """The server's ``used_memory`` and ``connected_clients``."""
    memory, clients = client.info("memory"), client.info("clients")
    return {"used_memory": int(memory["used_memory"]), "connected_clients": int(clients["connected_clients"])}
