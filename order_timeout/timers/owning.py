"""What the engine's stores ask of a kind before anything else: whose rows, and on which database.

The table of deadlines and the dead letters each extend it with what they need more (a Protocol
each, so neither imports the kinds that use them: no import circle).
"""

from __future__ import annotations

from typing import Any, Protocol


class OwnsRows(Protocol):
    """A kind as named in its records: its name, its model, the database alias its rows live on."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> Any: ...

    @property
    def using(self) -> str: ...
