"""The Job table as the mirror writes it: one conditional upsert per batch of rows.

Every write carries the position in its queue shard's events stream that the state it
holds is as of (``last_event_ms``, ``last_event_seq``; ``Commands.read_jobs`` reads a
job hash and that position at one instant), and replaces a stored row only when the
row's position is older::

    INSERT INTO django_delayq_job (...) ...
    ON CONFLICT (queue, job_id) DO UPDATE SET ... = excluded. ...
    WHERE (stored ms, stored seq) < (excluded ms, excluded seq)

So no row lock is needed: PostgreSQL checks the condition on the newest version of the
row once it holds the row (a concurrent writer's commit is waited for), SQLite runs one
writer at a time, and whatever the order in which two mirrors (or a mirror and
:func:`~.consumer.refresh_rows`) write one job, the row ends holding the newest state
either read; a batch written twice changes nothing (not even ``updated_at``).

Not ``bulk_create(update_conflicts=True)``: Django compiles the SQL of every value of
every row in Python, which made the mirror cost ten times the job it mirrors. Here the
statement is built once from the model's fields (a field added to ``Job`` is written
too), in the shape each database runs at the least cost (``bench/mirror.py`` measured
them): on SQLite, a one-row ``VALUES`` statement prepared once and run for every row,
each value adapted by its field only where a plain value would not do (times, JSON); on
PostgreSQL, the whole batch as one JSON document (one C-encoded parameter) that
``json_populate_recordset`` turns into rows, one statement parsed and planned once,
where one statement per row cost the server three times as much.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from operator import itemgetter
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Field, Q, QuerySet
from django.db.models.functions import Collate

from ..conf import django_time
from ..engine.status import FINISHED_IN_HISTORY, UNFINISHED, Status
from ..models import Job

#: A row to write: values by field name (``Field.attname``); a field left out takes its
#: default.
Row = dict[str, Any]
#: A stream entry id as numbers, ``(ms, seq)``; (0, 0) is no known position.
Position = tuple[int, int]
NO_POSITION: Position = (0, 0)
#: Fields a database takes as the Python value itself: no adaptation needed.
PLAIN = frozenset({
    "CharField", "TextField", "SmallIntegerField", "IntegerField", "BigIntegerField",
    "PositiveSmallIntegerField", "PositiveIntegerField", "PositiveBigIntegerField",
    "FloatField",
})
#: The databases whose upsert takes a condition (``ON CONFLICT ... DO UPDATE ... WHERE``).
VENDORS = ("sqlite", "postgresql")
#: The unique key of a row.
KEY = ("queue", "job_id")
#: Ids per query that reads stored positions.
READ_CHUNK = 500


def alias() -> str:
    """The database the mirror writes to (``Job``'s, as the database routers say)."""
    return router.db_for_write(Job)


def check_database() -> None:
    """Refuse a database the upsert cannot run on, before anything is written."""
    vendor = connections[alias()].vendor
    if vendor not in VENDORS:
        raise ImproperlyConfigured(
            f"the model mirror writes to SQLite or PostgreSQL, and the database "
            f"{alias()!r} is {vendor}: run the workers with --no-mirror")


def fields() -> list[Field[Any, Any]]:
    """Every column the mirror writes: all of ``Job``'s but its primary key."""
    return [f for f in Job._meta.concrete_fields if not f.primary_key]


def position_fields(position: Position, now: dt.datetime) -> Row:
    """The values that say which position a row is as of, and when it was written."""
    ms, seq = position
    return {"last_event_id": f"{ms}-{seq}", "last_event_ms": ms, "last_event_seq": seq,
            "updated_at": now, "missing_at": None}


def positions(queue: str, job_ids: Iterable[str]) -> dict[str, Position]:
    """The stored position of each of ``job_ids`` that has a row."""
    ids = list(job_ids)
    found: dict[str, Position] = {}
    with connections[alias()].cursor() as cursor:
        for start in range(0, len(ids), READ_CHUNK):
            part = ids[start:start + READ_CHUNK]
            cursor.execute(_positions_sql(len(part)), [queue, *part])
            found.update((job_id, (ms, seq)) for job_id, ms, seq in cursor.fetchall())
    return found


def lock_rows(queue: str, job_ids: Iterable[str], now: dt.datetime) -> dict[str, Row]:
    """The rows of ``job_ids`` as values (not model instances: a lagging mirror reads
    thousands), made (empty, at no position) where missing, and locked until the
    transaction ends: for events that apply to what a row holds."""
    ids = sorted(job_ids)
    # Every value given, so no row looks its defaults up again (they are only written).
    empty = {**{f.attname: f.get_default() for f in fields()},
             "queue": queue, "status": Status.READY, "updated_at": now}
    # On SQLite, this write takes the write lock.
    _write([{**empty, "job_id": job_id} for job_id in ids], _if_missing())
    return {row["job_id"]: row for row in Job.objects.using(alias()).select_for_update()
            .filter(queue=queue, job_id__in=ids).order_by(_by_code_point("job_id"))
            .values(*(f.attname for f in fields()))}


def _by_code_point(name: str) -> str | Collate:
    """An order by the text column ``name`` that agrees with Python's ``sorted``, the
    order every write here takes its row locks in: two transactions that lock rows in
    different orders can deadlock. PostgreSQL orders text by the database's collation
    (``en_US`` puts ``a`` before ``B``; code points put it after), so it is told to
    compare bytes ("C"), which for UTF-8 is code point order; SQLite's default does."""
    if connections[alias()].vendor == "postgresql":
        return Collate(name, "C")
    return name


def upsert(rows: Iterable[Row]) -> None:
    """Write ``rows`` (each with its position: :func:`position_fields`) where they are
    newer than what is stored; in the caller's transaction, if any."""
    newest: dict[str, Row] = {}  # one row per job (a statement may not touch one twice)
    for row in rows:
        held = newest.get(row["job_id"])
        if held is None or _position(row) > _position(held):
            newest[row["job_id"]] = row
    _write([newest[job_id] for job_id in sorted(newest)],  # one lock order for all
           _if_older())


def _write(rows: list[Row], on_conflict: str) -> None:
    """Insert ``rows``, ``on_conflict`` saying what becomes of a row already stored."""
    if not rows:
        return
    connection = connections[alias()]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_recordset_statement(on_conflict), [_document(rows)])
        else:
            columns = _Columns(connection)
            cursor.executemany(_values_statement(on_conflict),
                               [columns.values(row) for row in rows])


def _position(row: Row) -> Position:
    return row["last_event_ms"], row["last_event_seq"]


class StoredJSON:
    """A JSON value with the text it was stored as, which a database takes as it is (its
    reader checked that): written without being encoded again where JSON is text."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: Any) -> None:
        self.text, self.value = text, value


# -- SQLite: one row per run of a prepared statement -------------------------------------

Adapter = Callable[[Any], Any]


class _Columns:
    """Turns rows into the statement's parameters, for one connection and one batch."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        all_fields = fields()
        self.names = [f.attname for f in all_fields]
        self._defaults = {f.attname: f.get_default for f in all_fields}
        self._every = itemgetter(*self.names)
        self._adapted = [(i, adapt) for i, f in enumerate(all_fields)
                         if (adapt := _adapter(f, connection)) is not None]

    def values(self, row: Row) -> list[Any]:
        try:
            values = list(self._every(row))
        except KeyError:  # a field left out: its default
            values = [row[name] if name in row else self._defaults[name]()
                      for name in self.names]
        for i, adapt in self._adapted:
            values[i] = adapt(values[i])
        return values


def _adapter(field: Field[Any, Any], connection: BaseDatabaseWrapper) -> Adapter | None:
    """``field.get_db_prep_save`` for the values a row holds, in fewer steps where they
    are most of the cost (None: the value is taken as it is). A time or a JSON value goes
    straight to the backend's adaptation, where ``get_db_prep_save`` ends for an aware
    datetime or a JSON value (None stays SQL NULL)."""
    kind = field.get_internal_type()
    if kind in PLAIN:
        return None
    if kind == "DateTimeField":
        adapt_time = connection.ops.adapt_datetimefield_value
        seen: dict[Any, Any] = {}  # a batch's rows share times (updated_at, often run_at)

        def time_value(value: Any) -> Any:
            try:
                return seen[value]
            except KeyError:
                adapted = seen[value] = adapt_time(django_time(value))  # USE_TZ off: local
                return adapted
        return time_value
    if kind == "JSONField":
        adapt_json, encoder = connection.ops.adapt_json_value, field.encoder
        # A backend that takes JSON as text takes the stored text as it is.
        text_as_is = adapt_json([], encoder) == "[]"
        empty: dict[type, Any] = {list: adapt_json([], encoder), dict: adapt_json({}, encoder)}

        def json_value(value: Any) -> Any:
            of = type(value)
            if of is StoredJSON:
                return value.text if text_as_is else adapt_json(value.value, encoder)
            if value is None:
                return None
            if not value and of in empty:  # most jobs' kwargs, parents, ...
                return empty[of]
            return adapt_json(value, encoder)
        return json_value

    def prepared(value: Any) -> Any:
        return field.get_db_prep_save(value, connection)
    return prepared


@cache
def _values_statement(on_conflict: str) -> str:
    """The insert of one row, ``%s`` for each of its values."""
    one = "(" + ", ".join(["%s"] * len(fields())) + ")"
    return f"{_insert()} VALUES {one} {on_conflict}"


# -- PostgreSQL: one statement per batch --------------------------------------------------


def _document(rows: list[Row]) -> str:
    """The rows as a JSON array of objects keyed by column (what a row leaves out takes
    its field's default)."""
    every = fields()
    as_named = all(f.attname == f.column for f in every)
    complete = [row if as_named and len(row) == len(every) else _with_defaults(row, every)
                for row in rows]
    return json.dumps(complete, default=_json_default, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))


def _with_defaults(row: Row, every: list[Field[Any, Any]]) -> Row:
    return {f.column: row[f.attname] if f.attname in row else f.get_default() for f in every}


def _json_default(value: Any) -> Any:
    if type(value) is StoredJSON:
        return value.value
    if isinstance(value, dt.datetime):
        return value.isoformat()  # every digit: DjangoJSONEncoder cuts microseconds
    raise TypeError(f"{type(value).__name__} is not a value of a job row")


@cache
def _recordset_statement(on_conflict: str) -> str:
    """The insert of the rows of one JSON document (:func:`_document`): a JSON null in a
    JSON column is SQL NULL, as Django writes None."""
    table = _quote(Job._meta.db_table)
    selected = ", ".join(
        f"NULLIF({_quote(f.column)}, 'null'::jsonb)" if f.get_internal_type() == "JSONField"
        else _quote(f.column) for f in fields())
    return (f"{_insert()} SELECT {selected} "
            f"FROM json_populate_recordset(NULL::{table}, %s::json) {on_conflict}")


# -- both ------------------------------------------------------------------------------


def _insert() -> str:
    columns = ", ".join(_quote(f.column) for f in fields())
    return f"INSERT INTO {_quote(Job._meta.db_table)} ({columns})"


def _key_columns() -> list[str]:
    return [Job._meta.get_field(name).column for name in KEY]


@cache
def _if_missing() -> str:
    """Keep a stored row as it is."""
    return f"ON CONFLICT ({', '.join(_quote(c) for c in _key_columns())}) DO NOTHING"


@cache
def _if_older() -> str:
    """Replace the stored row only when it is as of an older position."""
    table = _quote(Job._meta.db_table)
    key = _key_columns()
    updated = ", ".join(f"{_quote(f.column)} = excluded.{_quote(f.column)}"
                        for f in fields() if f.column not in key)
    ms, seq = (_quote(Job._meta.get_field(name).column)
               for name in ("last_event_ms", "last_event_seq"))
    return (f"ON CONFLICT ({', '.join(_quote(c) for c in key)}) DO UPDATE SET {updated} "
            f"WHERE ({table}.{ms}, {table}.{seq}) < (excluded.{ms}, excluded.{seq})")


@cache
def _positions_sql(ids: int) -> str:
    """The stored positions of ``ids`` jobs of one queue."""
    column = {name: _quote(Job._meta.get_field(name).column)
              for name in ("job_id", "queue", "last_event_ms", "last_event_seq")}
    return (f"SELECT {column['job_id']}, {column['last_event_ms']}, "
            f"{column['last_event_seq']} FROM {_quote(Job._meta.db_table)} "
            f"WHERE {column['queue']} = %s AND {column['job_id']} IN "
            f"({', '.join(['%s'] * ids)})")


def _quote(name: str) -> str:
    return f'"{name}"'  # SQL's quoted identifier, as SQLite and PostgreSQL both take it


#: Rows a prune deletes per statement.
PRUNE_CHUNK = 5_000


def prune(*, older_than: dt.datetime | None = None, keep: Mapping[str, int] | None = None,
          queue: str | None = None) -> dict[str, int]:
    """Delete finished rows (completed, failed, cancelled, purged; never a job still to
    run): those finished before ``older_than`` and, for each status in ``keep``, all but
    the newest N of that status (by finish time; per queue when ``queue`` names one).
    Rows of jobs found gone from Redis before ``older_than`` (``missing_at``) go too, as
    ``missing``: none of them will run. Deletes in chunks of PRUNE_CHUNK rows, each its
    own statement. Returns the rows deleted per status."""
    finished = Job.objects.using(alias())
    if queue is not None:
        finished = finished.filter(queue=queue)
    deleted: dict[str, int] = {}
    for status in FINISHED_IN_HISTORY:
        rows = finished.filter(status=status)
        count = 0
        if older_than is not None:
            old = rows.filter(Q(finished_at__lt=older_than)
                              | Q(finished_at__isnull=True, updated_at__lt=older_than))
            count += _delete_chunks(old)
        if keep is not None and status in keep:
            newest_first = rows.order_by(F("finished_at").desc(nulls_last=True), "-pk")
            count += _delete_chunks(newest_first, after=keep[status])
        if count:
            deleted[status] = count
    if older_than is not None:
        count = _delete_chunks(finished.filter(status__in=UNFINISHED,
                                               missing_at__lt=older_than))
        if count:
            deleted["missing"] = count
    return deleted


def _delete_chunks(rows: QuerySet[Job], *, after: int = 0) -> int:
    """Delete ``rows`` but their first ``after``, PRUNE_CHUNK rows a statement."""
    total = 0
    while pks := list(rows.values_list("pk", flat=True)[after:after + PRUNE_CHUNK]):
        total += Job.objects.using(alias()).filter(pk__in=pks).delete()[0]
    return total
