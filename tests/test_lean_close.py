"""The close's lean path (issue 21) decides exactly as the ORM would: the batch's ``IN`` list
written once (``KeysIn``), DATETIME decoded in C on MySQL, members parsed with the model looked
up once. Each is checked against what it replaced, on every key type a shop's model may have."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given, strategies as st

from order_timeout.db import datetimes
from order_timeout.db.keys import KeysIn
from order_timeout.models import Order
from order_timeout.timers.registry import ORDER_TIMEOUT
from testproject.shop.models import PlainOrder, PlainOrderDeadline, ShopOrder, UuidOrder

pytestmark = pytest.mark.django_db


def test_keys_in_selects_exactly_the_rows_pk_in_selects() -> None:
    orders = Order.objects.bulk_create([Order(expires_at=timezone.now()) for _ in range(7)])
    keys = [orders[1].pk, orders[4].pk, orders[6].pk, 10**12]
    assert (sorted(Order.objects.filter(KeysIn(keys)).values_list("pk", flat=True))
            == sorted(Order.objects.filter(pk__in=keys).values_list("pk", flat=True)))


def test_keys_in_writes_integer_keys_as_digits_and_others_as_parameters() -> None:
    Order.objects.create(expires_at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        list(Order.objects.filter(KeysIn([3, 41, 5])))
    assert "IN (3, 41, 5)" in queries[-1]["sql"]
    spelled = uuid.uuid4()
    order = UuidOrder.objects.create(id=spelled, expires_at=timezone.now())
    # A UUID goes through the field's own conversion (hex on MySQL, a uuid on PostgreSQL).
    assert list(UuidOrder.objects.filter(KeysIn([spelled, uuid.uuid4()]))) == [order]


def test_a_key_that_only_looks_like_an_int_is_a_parameter_not_sql() -> None:
    class Sneaky(int):
        def __str__(self) -> str:
            return "1) OR (1=1"

    Order.objects.bulk_create([Order(expires_at=timezone.now()) for _ in range(3)])
    assert list(Order.objects.filter(KeysIn([Sneaky(10**12)]))) == []


def test_keys_in_with_no_keys_selects_nothing() -> None:
    Order.objects.create(expires_at=timezone.now())
    assert list(Order.objects.filter(KeysIn([]))) == []


def test_keys_in_updates_only_the_named_rows() -> None:
    orders = Order.objects.bulk_create([Order(expires_at=timezone.now()) for _ in range(4)])
    assert Order.objects.filter(KeysIn([orders[0].pk, orders[2].pk])).update(close_reason="x") == 2
    assert sorted(Order.objects.filter(close_reason="x").values_list("pk", flat=True)) == [orders[0].pk,
                                                                                            orders[2].pk]


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)))
def test_the_fast_datetime_decoder_agrees_with_mysqlclients(moment: datetime) -> None:
    pytest.importorskip("MySQLdb")
    from MySQLdb.times import DateTime_or_None

    for text in (moment.isoformat(" "), moment.replace(microsecond=0).isoformat(" ")):
        assert datetimes.decode(text) == DateTime_or_None(text)


@pytest.mark.parametrize("text", ["0000-00-00 00:00:00", "2026-12-02 02:15:39.1", "2026-12-02",
                                  "2026-02-30 00:00:00", "2026-12-02 02:15:39.1234567", "garbage"])
def test_odd_datetime_texts_decode_as_mysqlclient_decodes_them(text: str) -> None:
    pytest.importorskip("MySQLdb")
    from MySQLdb.times import DateTime_or_None

    assert datetimes.decode(text) == DateTime_or_None(text)


def test_the_consumer_decodes_datetimes_in_c_on_mysql_with_the_same_values() -> None:
    if connection.vendor != "mysql":
        pytest.skip("mysqlclient's decoder: MySQL and MariaDB only")
    deadline = timezone.now().replace(microsecond=123456) - timedelta(seconds=1)
    order = Order.objects.create(expires_at=deadline)
    datetimes.install()
    connection.ensure_connection()
    from MySQLdb.constants import FIELD_TYPE

    assert connection.connection.converter[FIELD_TYPE.DATETIME] is datetimes.decode
    assert Order.objects.get(pk=order.pk).expires_at == deadline


def test_members_are_parsed_as_one_by_one_parsing_would() -> None:
    parse = ORDER_TIMEOUT.parser()
    assert parse("42") == ORDER_TIMEOUT.parse("42") == 42
    for malformed in ("", "042", "4 2", "x"):
        with pytest.raises(ValueError):
            parse(malformed)


def test_the_batch_statements_find_their_rows_by_the_primary_key() -> None:
    """The locking SELECT and the close's UPDATE name the batch by key, and the database reads
    only those rows: on MySQL a boolean expression in WHERE (``(...) = 1``) would scan the table."""
    if connection.vendor != "mysql":
        pytest.skip("the MySQL backend's way of writing a boolean expression in WHERE")
    from django.db import transaction

    from order_timeout.db.locks import lock_orders

    orders = Order.objects.bulk_create([Order(expires_at=timezone.now()) for _ in range(300)])
    keys = [order.pk for order in orders[100:110]]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        lock_orders(Order._base_manager, keys)
        Order._base_manager.filter(Order.unpaid_q(), KeysIn(keys)).update(close_reason="x")
    statements = [query["sql"] for query in queries.captured_queries
                  if query["sql"].startswith(("SELECT", "UPDATE")) and "IN (" in query["sql"]]
    assert len(statements) == 2, statements
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute("EXPLAIN " + sql)
            columns = [column[0] for column in cursor.description]
            plan = dict(zip(columns, cursor.fetchone(), strict=True))
            assert (plan["key"], int(plan["rows"])) == ("PRIMARY", 10), (sql[:120], plan)


@pytest.mark.parametrize("model", [Order, UuidOrder], ids=["integer-key", "uuid-key"])
def test_rows_locked_as_tuples_hold_what_instances_would(model) -> None:
    """The close's batch read through the cursor (issue 28): each value converted as the ORM
    converts it, on MySQL's naive DATETIME and on a UUID key stored as text alike."""
    from django.db import transaction

    from order_timeout.db.locks import lock_orders

    deadline = timezone.now().replace(microsecond=654321) - timedelta(minutes=3)
    rows = [model.objects.create(expires_at=deadline - timedelta(seconds=index)) for index in range(3)]
    keys = [row.pk for row in rows]
    with transaction.atomic():
        as_tuples = lock_orders(model._base_manager, keys, columns=("status", "expires_at"))
    with transaction.atomic():
        as_instances = lock_orders(model._base_manager, keys)
    assert not as_tuples.instances and as_instances.instances
    assert set(as_tuples.rows) == set(as_instances.rows) == set(keys)
    for name in ("status", "expires_at"):
        assert as_tuples.values(name) == as_instances.values(name)
    assert as_tuples.values("expires_at")[rows[0].pk] == deadline
    assert as_tuples.db_now is not None and as_tuples.db_now.tzinfo is not None
    assert abs(as_tuples.db_now - timezone.now()) < timedelta(minutes=1)


def _rows_of(model, keys):
    """One row of each kind a shop's order model holds: a decimal, a key of its own, a foreign key."""
    deadline = timezone.now().replace(microsecond=123456) - timedelta(minutes=2)
    if model is ShopOrder:
        rows = [ShopOrder.objects.create(number=f"N{index}", total="12.34", expires_at=deadline)
                for index in range(keys)]
    elif model is PlainOrderDeadline:
        rows = [PlainOrderDeadline.objects.create(order=PlainOrder.objects.create(), expires_at=deadline)
                for _ in range(keys)]
    else:
        rows = [model.objects.create(expires_at=deadline) for _ in range(keys)]
    return [row.pk for row in rows]


def _as_read(instance):
    """What an instance holds, each value with its type and time zone (``repr``), but the lock's clock."""
    values = {name: repr(value) for name, value in vars(instance).items() if name not in ("_state", "_timeout_db_now")}
    return values, instance._state.adding, instance._state.db


@pytest.mark.parametrize("model", [Order, UuidOrder, ShopOrder, PlainOrderDeadline],
                         ids=["integer-key", "uuid-key", "shop-model", "foreign-key"])
def test_instances_locked_for_receivers_are_the_ones_the_orm_builds(model) -> None:
    """The instances a receiver gets are read through the cursor and built by the model's own
    ``from_db``: every value of the same type and time zone as the ORM's own read gives it."""
    from django.db import transaction

    from order_timeout.db.locks import lock_orders

    keys = _rows_of(model, 3)
    with transaction.atomic():
        locked = lock_orders(model._base_manager, keys)
    by_the_orm = {row.pk: row for row in model._base_manager.filter(pk__in=keys)}
    assert locked.instances and set(locked.rows) == set(keys)
    for key, instance in locked.rows.items():
        assert type(instance) is model
        assert _as_read(instance) == _as_read(by_the_orm[key])
    assert locked.db_now is not None and abs(locked.db_now - timezone.now()) < timedelta(minutes=1)


def test_the_instances_locking_select_is_compiled_once_and_then_only_given_its_keys() -> None:
    from django.db import transaction
    from django.db.models.sql.compiler import SQLCompiler

    from order_timeout.db.locks import lock_orders

    keys = _rows_of(Order, 4)
    with transaction.atomic():
        lock_orders(Order._base_manager, keys[:2])
    compiled = []
    as_sql = SQLCompiler.as_sql

    def counting(self, *args, **kwargs):
        compiled.append(self.query.model)
        return as_sql(self, *args, **kwargs)

    SQLCompiler.as_sql = counting
    try:
        with transaction.atomic():
            locked = lock_orders(Order._base_manager, keys[2:])
    finally:
        SQLCompiler.as_sql = as_sql
    assert set(locked.rows) == set(keys[2:]) and locked.instances
    assert compiled == []


def test_a_manager_that_reads_related_rows_along_still_hands_them_to_the_receivers() -> None:
    """A base manager with ``select_related`` (or deferred fields, or annotations of its own) gets
    its instances as its queryset builds them: the related rows come along, no query each."""
    from django.db import transaction

    from order_timeout.db.locks import lock_orders

    keys = _rows_of(PlainOrderDeadline, 2)
    with transaction.atomic():
        locked = lock_orders(PlainOrderDeadline._base_manager.select_related("order"), keys)
        with CaptureQueriesContext(connection) as queries:
            statuses = {row.order.status for row in locked.rows.values()}
    assert statuses == {"pending"} and len(queries) == 0


def test_a_queryset_that_builds_its_own_instances_still_builds_the_receivers_ones() -> None:
    """A base manager whose queryset iterates its own way (django-polymorphic hands each row over
    as its subclass) gets its instances from that queryset."""
    from django.db import transaction
    from django.db.models.query import ModelIterable

    from order_timeout.db.locks import lock_orders

    class Tagging(ModelIterable):
        def __iter__(self):
            for instance in super().__iter__():
                instance.built_by_the_shop = True
                yield instance

    keys = _rows_of(Order, 2)
    queryset = Order._base_manager.all()
    queryset._iterable_class = Tagging
    with transaction.atomic():
        locked = lock_orders(queryset, keys)
    assert set(locked.rows) == set(keys)
    assert all(getattr(row, "built_by_the_shop", False) for row in locked.rows.values())


@pytest.mark.parametrize("spelling", ["0{pk}", "+{pk}", " {pk}", "{pk} ", "{pk}_0", "{pk}.0"])
def test_a_member_that_int_would_read_as_a_key_but_is_not_one_names_no_order(spelling) -> None:
    """A claim's integer members are read for the whole batch at once (issue 28), yet a member
    int() accepts and no order has as its member stays malformed, as one by one it is."""
    members = ["5", spelling.format(pk=5), "6"]
    by_key, malformed = ORDER_TIMEOUT.keys_of(members)
    assert by_key == {5: "5", 6: "6"} and malformed == [spelling.format(pk=5)]
    assert ORDER_TIMEOUT.keys_of(["5", "6", "70"]) == ({5: "5", 6: "6", 70: "70"}, [])


@pytest.mark.parametrize("statement", ["lock", "hold", "lock-of-a-32-bit-key"])
def test_a_batch_statement_from_its_template_is_the_one_the_orm_compiles(statement) -> None:
    """The batch's statements are compiled once per shape and each batch's keys written in
    (issue 28): the text and parameters the ORM gives for those keys, first key included,
    whatever the key's integer field (a marker out of its range would be left out)."""
    from django.contrib.auth.models import User

    from order_timeout.db import locks, templates
    from testproject.shop.payments import in_flight

    manager = User._base_manager if statement == "lock-of-a-32-bit-key" else Order._base_manager

    def build(keys):
        if statement == "hold":
            return locks._rows_meeting(manager, in_flight(), keys).values_list("pk")
        return locks._locking(manager, keys).values_list("pk", "_timeout_db_now")

    shape = ("test", statement, uuid.uuid4().hex)
    for keys in ([3, 41, 5], [7], list(range(10, 510))):
        ours = templates.compiled(shape, "default", build, keys, names_first_key=statement != "hold")
        sql, params = build(keys).query.get_compiler(using="default").as_sql()
        assert (ours.sql, ours.params) == (sql, tuple(params))
    assert templates._templates[("default", shape)] is not None  # the second and third came from it


def test_a_batch_statement_of_keys_that_are_not_integers_is_compiled_as_the_orm_compiles_it() -> None:
    from order_timeout.db import locks, templates

    keys = [uuid.uuid4(), uuid.uuid4()]
    ours = templates.compiled(("test", uuid.uuid4().hex), "default",
                              lambda batch: locks._locking(UuidOrder._base_manager, batch).values_list("pk"), keys)
    sql, params = locks._locking(UuidOrder._base_manager, keys).values_list("pk").query.get_compiler(
        using="default").as_sql()
    assert (ours.sql, ours.params) == (sql, tuple(params))


@pytest.fixture
def database_in_new_york():
    """The database stores local times (``DATABASES[...]["TIME_ZONE"]``): MySQL and MariaDB only,
    PostgreSQL keeps its time zones itself."""
    if connection.vendor != "mysql":
        pytest.skip("DATABASES TIME_ZONE is for a database without time zone support")
    before = connection.settings_dict["TIME_ZONE"]
    connection.settings_dict["TIME_ZONE"] = "America/New_York"
    for cached in ("timezone", "timezone_name"):
        connection.__dict__.pop(cached, None)
    yield
    connection.settings_dict["TIME_ZONE"] = before
    for cached in ("timezone", "timezone_name"):
        connection.__dict__.pop(cached, None)


@pytest.mark.parametrize("columns", [None, ("status", "expires_at")], ids=["instances", "tuples"])
def test_the_clock_a_locking_select_reads_is_the_databases_own_in_a_database_of_local_times(
        database_in_new_york, columns) -> None:
    """``UTC_TIMESTAMP`` is read in UTC whatever the connection's zone: labelled in New York's it
    stood five hours ahead, and an order an hour from its deadline read as due."""
    from django.db import transaction

    from order_timeout.db.locks import lock_orders

    order = Order.objects.create(expires_at=timezone.now() + timedelta(hours=1))
    with transaction.atomic():
        locked = lock_orders(Order._base_manager, [order.pk], columns=columns)

    assert abs(locked.db_now - timezone.now()) < timedelta(minutes=1)
    assert locked.values("expires_at")[order.pk] == order.expires_at
    assert locked.db_now < order.expires_at
