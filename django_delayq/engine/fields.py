"""The fields of a job HASH (``{dq:Q}:j:ID``): the one place that names them.

A waiting job is mostly its hash, and Redis stores a small hash as one listpack holding
every field name next to its value, so the names are kept to one or two characters and
a field equal to its default is not stored at all. The Lua scripts use the stored names
(``lua/enqueue.lua`` writes a new job's hash); Python reads a hash through
:func:`logical`, so ``Job`` attributes, the API, the admin and the mirror keep the
logical names.

=============  ======  ===========================================  =======
logical name   stored  meaning                                      default
=============  ======  ===========================================  =======
task           ``t``   task name
args           ``a``   positional arguments, JSON
kwargs         ``k``   keyword arguments, JSON                      ``{}``
priority       ``p``   priority, -100..100 (higher runs first)      ``0``
status         ``s``   scheduled, ready, active, completed, ...
run_at         ``r``   when it may start (is due), ms             enqueued_at
enqueued_at    ``e``   when it was enqueued, ms
max_attempts   ``m``   runs allowed, the first included             ``1``
attempts       ``n``   runs started so far                          ``0``
seq            ``q``   FIFO number, set when the job became ready
started_at     ``b``   when the latest attempt began, ms
finished_at    ``f``   when it finished (or its latest attempt), ms
worker         ``w``   the worker of the latest attempt
result         ``v``   return value, JSON
error          ``x``   one line: exception class and message
traceback      ``tb``  traceback of the latest failure
progress       ``g``   fraction done, 0..1, as the task reported it
progress_      ``gm``  the message reported with the progress       none
message
timeout        ``o``   time limit of each attempt, ms               none
attempt_log    ``h``   the last 25 attempts, JSON (see below)       ``[]``
aborted_by     ``ab``  who asked for its abort (or cancel)           none
parents        ``d``   parents waited for, JSON ``[[queue, id]]``   none
parent_policy  ``dp``  on a parent's failure: run, fail             cancel
parent_        ``dr``  parents' results passed: one, all            none
results
linked         ``dc``  '1' once a dependant waits for this job      none
concurrency_   ``ck``  its concurrency key (engine/keyed.py)        none
key
concurrency_   ``cl``  at most this many of the key's jobs leased   none
limit
key_weight     ``cw``  turns of its key per turn of a weight-1 key  ``1``
waiting_for_   ``kw``  '1' while parked: its key is at its limit    none
slot
key_rate_      ``kr``  at most this many starts of its key per      none
limit                  ``kp`` (engine/keyed.py, ``key_rate_limit``)
key_rate_      ``kp``  the period of ``kr``, ms                     none
period
traceparent    ``tp``  W3C trace context of the enqueue             none
format         ``fv``  the hash's format version (:data:`FORMAT`)   ``1``
=============  ======  ===========================================  =======

``parents`` to ``linked`` serve workflows (``lua/includes/flows.lua`` describes them and
the keys ``<job key>:w``, ``:r`` and ``:c`` that go with them).

``attempt_log`` is a JSON array of ``{"n": attempt, "w": worker, "b": start ms,
"f": end ms, "o": outcome, "x": error, "t": traceback}``, oldest first, capped at the
last :data:`ATTEMPT_LOG_SIZE` attempts. The attempt that completed the job is not in it:
the hash's ``attempts``, ``worker``, ``started_at`` and ``finished_at`` are its entry
(``jobhash.with_completed_attempt`` adds it for readers), so a job completed at its first
attempt stores no log. ``o`` is ``completed`` (in a log written by an earlier release),
``retried``, ``failed``,
``aborted`` (its abort was asked for: the job ended ``cancelled``) or ``reclaimed`` (the
worker's lease lapsed). Only a failed attempt (``retried``,
``failed``) has ``t``: the end of its traceback, its last :data:`ATTEMPT_TRACEBACK`
bytes.

A field with a default is not stored while it equals it: every script and reader takes
an absent one as that default (an absent run_at is the job's enqueued_at: a job enqueued
to run at once). The others are written whenever the job has a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

#: Logical name -> the field name stored in the job hash.
STORED: Final[Mapping[str, str]] = {
    "task": "t",
    "args": "a",
    "kwargs": "k",
    "priority": "p",
    "status": "s",
    "run_at": "r",
    "enqueued_at": "e",
    "max_attempts": "m",
    "attempts": "n",
    "seq": "q",
    "started_at": "b",
    "finished_at": "f",
    "worker": "w",
    "result": "v",
    "error": "x",
    "traceback": "tb",
    "progress": "g",
    "progress_message": "gm",
    "timeout": "o",
    "attempt_log": "h",
    "parents": "d",
    "parent_policy": "dp",
    "parent_results": "dr",
    "linked": "dc",
    "concurrency_key": "ck",
    "concurrency_limit": "cl",
    "key_weight": "cw",
    "waiting_for_slot": "kw",
    "key_rate_limit": "kr",
    "key_rate_period": "kp",
    "aborted_by": "ab",
    "traceparent": "tp",
    "format": "fv",
}

#: The format of the job hashes and events this code writes, and the newest it reads.
#: Every release so far writes format 1, which stores no ``fv`` (the default): a field
#: added with a default (``tp``) keeps the format, as readers of the same format ignore
#: it. A release that changes what an existing field means writes ``fv`` with the next
#: number, and says in CHANGELOG.md's upgrade section which releases may run beside it.
#: A reader meeting a newer format notes the job as damaged rather than misread it.
FORMAT = 1

#: Attempts kept in a job's ``attempt_log``.
ATTEMPT_LOG_SIZE = 25
#: Bytes of a failed attempt's traceback kept in its ``attempt_log`` entry (its end).
ATTEMPT_TRACEBACK = 2000

#: Stored field name -> logical name.
LOGICAL: Final[Mapping[str, str]] = {short: name for name, short in STORED.items()}

#: The value every reader assumes for a field the hash does not hold.
DEFAULTS: Final[Mapping[str, str]] = {
    "kwargs": "{}",
    "priority": "0",
    "max_attempts": "1",
    "attempts": "0",
    "format": "1",
}


def stored(name: str) -> str:
    """The stored field name of the logical field ``name`` (KeyError if unknown)."""
    return STORED[name]


def logical(data: Mapping[str, str]) -> dict[str, str]:
    """A job hash as HGETALL returns it, keyed by logical names.

    A field the table does not name is kept under its stored name, so nothing written
    by hand (or by a newer version) is silently lost to a reader.
    """
    fields = {LOGICAL.get(key, key): value for key, value in data.items()}
    if "run_at" not in fields and "enqueued_at" in fields:
        fields["run_at"] = fields["enqueued_at"]
    return fields
