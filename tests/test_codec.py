"""The one JSON codec (``engine/codec.py``): every producer stores the same bytes.

``@task`` (``enqueue``), ``enqueue_many``, the outbox, the Django Tasks backend, the
engine used bare and Spark's ``enqueue_dataframe`` (in tests/test_spark.py, which has
the SparkSession) all store a job's arguments as the text Django's ``DjangoJSONEncoder``
writes; Django's encoder is the oracle here, never used by the package.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import uuid
import zoneinfo
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.translation import gettext_lazy
from hypothesis import given, settings
from hypothesis import strategies as st

from django_delayq import Queue
from django_delayq.backends import parse_result_id
from django_delayq.connection import get_broker
from django_delayq.engine import Broker, EngineConfig
from django_delayq.engine.codec import decode, dumps, encode_arguments, encode_result
from django_delayq.engine.fields import stored
from tests.testapp import standard_tasks
from tests.testapp.tasks import take_anything

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
#: What a project passes: aware (UTC and not) and naive datetimes, a date, a naive time,
#: durations, a decimal, a UUID, a lazy string, nested JSON, unicode.
ARGS: list[Any] = [
    dt.datetime(2031, 1, 2, 3, 4, 5, 678_901, tzinfo=dt.UTC),
    dt.datetime(2031, 7, 2, 3, 4, 5, tzinfo=PARIS),
    dt.datetime(2031, 1, 2, 3, 4, 5, 600),
    dt.date(2031, 1, 2),
    dt.time(23, 59, 58, 999_999),
    dt.timedelta(days=-1, seconds=3, microseconds=5),
    dt.timedelta(days=2, hours=3, minutes=4, seconds=5),
    decimal.Decimal("12.50"),
    uuid.UUID(int=2**122 + 7),
    gettext_lazy("Cancel"),
    {"nested": [1, 2.5, None, True, {"ü": "日本", "e": []}], "big": 2**70},
    "naïve ☃ 😀 \u2028",
]
KWARGS: dict[str, Any] = {"when": dt.datetime(2031, 1, 2, tzinfo=dt.UTC),
                          "span": dt.timedelta(microseconds=1), "tags": ["a", "ß"]}
#: What Django's Tasks framework accepts (its normalize_json: no dates, decimals...).
PLAIN_ARGS: list[Any] = [{"nested": [1, 2.5, None, True, {"ü": "日本"}]}, 2**70, -0.5,
                         "naïve ☃ 😀"]
PLAIN_KWARGS: dict[str, Any] = {"tags": ["a", "ß"], "empty": {}}


def django_json(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, separators=(",", ":"), allow_nan=False)


def stored_arguments(queue: str, job_id: str) -> tuple[str, str]:
    """The job hash's ``args`` and ``kwargs`` fields, as Redis holds them."""
    broker = get_broker()
    args, kwargs = broker.client.hmget(broker.keys_for(queue, job_id).job(job_id),
                                       stored("args"), stored("kwargs"))
    return args, kwargs or "{}"


@pytest.mark.django_db(transaction=True)
def test_every_producer_stores_the_bytes_djangos_encoder_writes(redis_client):
    expected = (django_json(ARGS), django_json(KWARGS))
    assert '"P0DT00H00M00.000001S"' in expected[1]  # a duration, not seconds
    direct = take_anything.enqueue(*ARGS, **KWARGS)
    many = take_anything.enqueue_many([(ARGS, KWARGS)] * 2)
    outbox = take_anything.enqueue_in_transaction(*ARGS, **KWARGS)  # autocommit: sent now
    bare = Broker(redis_client, EngineConfig()).enqueue("default", take_anything.name,
                                                        ARGS, KWARGS)
    ids = [direct.id, *many.job_ids, outbox.id, bare.job_id]
    assert len(set(ids)) == 5
    for job_id in ids:
        assert stored_arguments("default", job_id) == expected, job_id


def test_the_tasks_backend_stores_what_the_other_producers_do(redis_client):
    result = standard_tasks.dj_take_anything.enqueue(*PLAIN_ARGS, **PLAIN_KWARGS)
    queue, job_id = parse_result_id(result.id)
    direct = take_anything.enqueue(*PLAIN_ARGS, **PLAIN_KWARGS)
    expected = (django_json(PLAIN_ARGS), django_json(PLAIN_KWARGS))
    assert stored_arguments(queue or "default", job_id) == expected
    assert stored_arguments("default", direct.id) == expected
    # What Django's Tasks framework does not take, its backend refuses before writing.
    with pytest.raises(TypeError, match="Unsupported type"):
        standard_tasks.dj_take_anything.enqueue(dt.date(2031, 1, 2))
    assert Queue("default").counts()["ready"] == 2


def test_a_refused_argument_is_named_and_nothing_is_written(redis_client):
    aware = dt.time(12, 0, tzinfo=dt.UTC)
    with pytest.raises(TypeError, match=r"positional argument 1 \(time\).*an aware time"):
        take_anything.enqueue("ok", aware)
    with pytest.raises(TypeError, match=r"argument 'span' \(float\)"):
        take_anything.enqueue(span=math.inf)
    with pytest.raises(TypeError, match=r"argument 'x' \(bytes\)"):
        take_anything.enqueue_many([((), {"x": b"raw"})])
    assert redis_client.dbsize() == 0


def test_results_use_the_same_codec():
    assert encode_result(ARGS) == django_json(ARGS)
    with pytest.raises(TypeError, match=r"return value \(set\)"):
        encode_result({1})


# -- properties -----------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
DJANGO_TYPES = st.one_of(
    st.datetimes(timezones=st.none() | st.timezones()),
    st.dates(),
    st.times(timezones=st.none() | st.timezones() | st.just(dt.UTC)),
    st.timedeltas(),
    st.decimals(),
    st.uuids(),
)
REFUSED = st.one_of(
    st.builds(object),
    st.binary(),
    st.sets(st.integers(), max_size=3),
    st.complex_numbers(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.times(timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-3))])),
    st.dictionaries(st.tuples(st.integers()), st.integers(), min_size=1, max_size=2),
)
QUICK = settings(deadline=None, database=None)


@QUICK
@given(value=JSON)
def test_any_json_value_round_trips(value):
    args_json, kwargs_json = encode_arguments("t.x", [value], {"k": value})
    assert (decode(args_json), decode(kwargs_json)) == ([value], {"k": value})
    assert decode(encode_result(value)) == value


@QUICK
@given(value=DJANGO_TYPES)
def test_each_type_is_written_as_djangos_encoder_writes_it_or_refused_as_it_is(value):
    try:
        expected: str | None = django_json(value)
    except (TypeError, ValueError, OverflowError):
        expected = None
    if expected is None:
        with pytest.raises(TypeError, match="argument 'v'"):
            encode_arguments("t.x", [], {"v": value})
    else:
        assert dumps(value) == expected


@QUICK
@given(good=JSON, bad=REFUSED, where=st.sampled_from(["top", "list", "dict", "kwarg"]))
def test_every_refused_value_raises_a_type_error_naming_its_argument(good, bad, where):
    value = {"top": bad, "list": [good, bad], "dict": {"k": good, "z": bad}}.get(where, bad)
    if where == "kwarg":
        call, name = ([good], {"opt": bad}), "argument 'opt'"
    else:
        call, name = ([good, value], {}), "argument 'b' (position 1)"
    with pytest.raises(TypeError, match=f"t.x: {name}".replace("(", r"\(").replace(")", r"\)")):
        encode_arguments("t.x", *call, names=["a", "b"])
    with pytest.raises(TypeError, match="return value"):
        encode_result([good, bad])
