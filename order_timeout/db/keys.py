"""``KeysIn``: a batch's ``WHERE pk IN (...)``, written once per batch instead of once per key.

Django's ``pk__in`` prepares each value of the list through the lookup
machinery (a resolve, a prep and a compile per value): about 7 us per key on
the consumer's hot path, where every batch names hundreds of keys twice (the
locking SELECT, the UPDATE). Here the keys come from members already parsed
by the primary key field itself (``parse_member``), so they need only the
field's conversion for the database; integer keys, the common case, are
written into the statement as digits (an ``int`` can only print as one), which
spares the driver its quoting of each parameter too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import F, Field, Lookup

# Primary key fields whose parsed keys (Python ints) go to the driver as they are.
INTEGER_FIELDS = frozenset({"AutoField", "BigAutoField", "SmallAutoField", "IntegerField", "BigIntegerField",
                             "SmallIntegerField", "PositiveIntegerField", "PositiveBigIntegerField"})


class KeysIn(Lookup):
    """True for rows whose primary key is one of ``keys``: ``filter(KeysIn(keys))``.

    A ``Lookup``, not a bare boolean expression: MySQL's backend writes any other conditional
    expression in a WHERE clause as ``(...) = 1``, which no index serves (every batch would scan
    the table); a lookup is written as it is, and the primary key's range serves it.
    """

    lookup_name = "keys_in"
    prepare_rhs = False

    def __init__(self, keys: Sequence[Any]) -> None:
        super().__init__(F("pk"), list(keys))

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        keys = self.rhs
        if not keys:
            raise EmptyResultSet
        column_sql, column_params = compiler.compile(self.lhs)
        field: Field[Any, Any] = self.lhs.target
        if field.get_internal_type() in INTEGER_FIELDS and all(type(key) is int for key in keys):
            # Exactly int (not bool, not a subclass with its own __str__): its str() is its digits.
            return f"{column_sql} IN ({', '.join(map(str, keys))})", tuple(column_params)
        params = [field.get_db_prep_value(key, connection, prepared=False) for key in keys]
        return f"{column_sql} IN ({', '.join(['%s'] * len(params))})", (*column_params, *params)
