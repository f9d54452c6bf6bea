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
from django.db.models import BooleanField, Expression, Field

# Primary key fields whose parsed keys (Python ints) go to the driver as they are.
_INTEGER_FIELDS = frozenset({"AutoField", "BigAutoField", "SmallAutoField", "IntegerField", "BigIntegerField",
                             "SmallIntegerField", "PositiveIntegerField", "PositiveBigIntegerField"})


class KeysIn(Expression):
    """True for rows whose primary key is one of ``keys``: ``filter(KeysIn(keys))``."""

    conditional = True
    output_field = BooleanField()

    def __init__(self, keys: Sequence[Any]) -> None:
        super().__init__()
        self.keys = list(keys)
        self.column: Any = None

    def resolve_expression(self, query: Any = None, allow_joins: bool = True, reuse: Any = None,
                           summarize: bool = False, for_save: bool = False) -> KeysIn:
        resolved = self.copy()
        resolved.column = query.resolve_ref("pk", allow_joins, reuse, summarize)
        return resolved

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        if not self.keys:
            raise EmptyResultSet
        column_sql, column_params = compiler.compile(self.column)
        field: Field[Any, Any] = self.column.target
        if field.get_internal_type() in _INTEGER_FIELDS and all(type(key) is int for key in self.keys):
            # Exactly int (not bool, not a subclass with its own __str__): its str() is its digits.
            return f"{column_sql} IN ({', '.join(map(str, self.keys))})", tuple(column_params)
        params = [field.get_db_prep_value(key, connection, prepared=False) for key in self.keys]
        return f"{column_sql} IN ({', '.join(['%s'] * len(params))})", (*column_params, *params)
