"""Loads the Lua scripts (one ``.lua`` file per operation) and runs them by SHA.

Only :mod:`~django_delayq.engine.commands` calls these, with each script's KEYS and ARGV.

Each script is its own file preceded by the definitions it uses, taken from the shared
``includes/common.lua`` and ``includes/flows.lua`` (workflows), in their order there.
Redis runs a script's whole body on every call, so each ``local function`` of the
includes costs a closure per call whether used or not: a script that sent all of them
would pay about 2 us more per call (enqueue, claim, ack) for code it never runs. For the
same reason the enqueue script is also loaded without the workflow definitions, as
``enqueue_plain`` (:data:`VARIANTS`), for the calls whose jobs wait for no parent.
Scripts are sent with EVALSHA; when Redis answers NOSCRIPT (a restart, SCRIPT FLUSH, a
failover) the script is loaded again and the call repeated, for single calls and
pipelines alike.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ReadOnlyError

from .cluster_wait import send_and_wait
from .pinned import PinnedConnections


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, full source and SHA1."""

    name: str
    source: str
    sha: str


def _read(path: str) -> str:
    return resources.files("django_delayq").joinpath("lua", path).read_text(encoding="utf-8")


INCLUDES = ("includes/common.lua", "includes/flows.lua")
#: Scripts loaded from another script's file with fewer includes: name -> (that file's
#: name, the includes it takes definitions from). ``enqueue_plain`` is ``enqueue.lua``
#: without the workflow definitions: the script reaches them only for jobs that wait for
#: parents (``m > 0``), and the closures they make cost a plain enqueue about a tenth of
#: its Redis time. Only :mod:`.commands` chooses it (``_enqueue_script``), for the
#: enqueue calls with no such job.
VARIANTS = {"enqueue_plain": ("enqueue", ("includes/common.lua",))}
#: A top-level definition of an include: ``local function name(`` or ``local NAME =``.
_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A Lua comment (the scripts hold no string with "--"): the names it mentions are not uses.
_COMMENT = re.compile(r"--[^\n]*")


def _words(code: str) -> set[str]:
    """The names ``code`` uses, its comments left out."""
    return set(_WORD.findall(_COMMENT.sub("", code)))


@cache
def _definitions(includes: tuple[str, ...] = INCLUDES) -> list[tuple[str, str]]:
    """Every top-level definition of ``includes`` as (name, its text with the comment
    lines just above it), in include order. A definition runs to the next one's comment
    lines, so nothing between two definitions (but comments) may run on its own."""
    out: list[tuple[str, str]] = []
    for path in includes:
        lines = _read(path).splitlines()
        starts = [i for i, line in enumerate(lines) if _DEFINITION.match(line)]
        if any(line.strip() and not line.startswith("--") for line in lines[:starts[0]]):
            raise ValueError(f"{path}: code before its first definition would be dropped")
        bounds = []
        for i in starts:
            while i > 0 and lines[i - 1].startswith("--"):
                i -= 1
            bounds.append(i)
        for start, end, head in zip(bounds, [*bounds[1:], len(lines)], starts, strict=True):
            name = _DEFINITION.match(lines[head]).group(1)  # type: ignore[union-attr]
            out.append((name, "\n".join(lines[start:end]).rstrip() + "\n"))
    return out


def used_definitions(body: str,
                     includes: tuple[str, ...] = INCLUDES) -> list[tuple[str, str]]:
    """The definitions of ``includes`` that ``body`` uses, directly or through another
    definition, in include order (each is defined before whatever uses it)."""
    definitions = _definitions(includes)
    wanted = _words(body)
    # Later definitions may use earlier ones only: one pass from the end finds them all.
    for name, text in reversed(definitions):
        if name in wanted:
            wanted |= _words(text)
    return [(name, text) for name, text in definitions if name in wanted]


@cache
def load_script(name: str) -> Script:
    """Return the script ``name``: ``lua/<name>.lua`` after the definitions of the
    includes it uses (for a name of :data:`VARIANTS`, its file and includes)."""
    file, includes = VARIANTS.get(name, (name, INCLUDES))
    body = _read(f"{file}.lua")
    source = "".join(text for _, text in used_definitions(body, includes)) + body
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def run_script(
    client: Any, name: str, keys: list[str], args: list[Any],
    pinned: PinnedConnections | None = None,
) -> Any:
    """Run one script on ``client``, loading it first if Redis does not know it.

    With ``pinned`` (connections of ``client``'s pool), the call skips the pool checkout.
    """
    script = load_script(name)
    # EVALSHA through execute_command: a cluster client routes it by its keys' slot.
    run = client.execute_command if pinned is None else pinned.execute
    try:
        return run("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.source)
        return run("EVALSHA", script.sha, len(keys), *keys, *args)
    except ReadOnlyError:
        drop_demoted(client, pinned)
        raise


def drop_demoted(client: Any, pinned: PinnedConnections | None = None) -> None:
    """After ``READONLY``: the connections reach a primary that a failover demoted (a
    managed service moved its address to the new one). Close them, so the next call
    connects again and reaches the new primary. A Sentinel client never gets here:
    redis-py turns READONLY into a connection error and asks the sentinels."""
    if pinned is not None:
        pinned.close()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()


def wait_command(replicas: int, timeout_ms: int) -> tuple[Any, ...]:
    """Redis ``WAIT``: block until ``replicas`` replicas have this connection's writes."""
    return ("WAIT", replicas, timeout_ms)


def call_and_wait(
    client: Any, name: str, keys: list[str], args: list[Any], wait: tuple[int, int],
    pinned: PinnedConnections | None = None,
) -> tuple[Any, int]:
    """Run one script and ``WAIT`` for ``wait = (replicas, timeout_ms)`` on the same
    connection, in one round trip (on a cluster, on a connection of the node serving the
    script's keys: :mod:`.cluster_wait`).

    Returns the script's reply and the number of replicas that confirmed it.
    """
    script = load_script(name)
    evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)

    def send() -> list[Any]:
        if is_cluster_client(client):
            replies, counts = send_and_wait(client, [(keys[0], evalsha)], wait)
            return [replies[0], counts[0]]
        if pinned is not None:
            return pinned.execute_many(evalsha, wait_command(*wait))
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*evalsha)
        pipe.execute_command(*wait_command(*wait))
        return list(pipe.execute(raise_on_error=False))

    reply, confirmed = send()
    if isinstance(reply, NoScriptError):
        client.script_load(script.source)
        reply, confirmed = send()
    for result in (reply, confirmed):
        if isinstance(result, ReadOnlyError):
            drop_demoted(client, pinned)
        if isinstance(result, Exception):
            raise result
    return reply, int(confirmed)


def is_cluster_client(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (a script then reaches one slot)."""
    return isinstance(client, RedisCluster)


class Batch:
    """Script calls sent together in one pipeline: one round trip for the lot.

    ``run()`` returns the results in call order. Calls that failed with NOSCRIPT are
    loaded and sent again; any other error is raised after every call has run.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._calls: list[tuple[str, list[str], list[Any]]] = []
        #: After ``run(wait=...)``: the fewest replicas that confirmed the calls.
        self.confirmed: int | None = None

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, name: str, keys: list[str], args: list[Any]) -> int:
        self._calls.append((name, keys, args))
        return len(self._calls) - 1

    def run(self, *, raise_on_error: bool = True,
            wait: tuple[int, int] | None = None) -> list[Any]:
        """The replies in call order. With ``raise_on_error`` False, a call that failed
        leaves its exception in its place instead of raising it (the other calls have
        run: a caller that must not lose their effects reads them).

        With ``wait = (replicas, timeout_ms)``, Redis ``WAIT`` follows the calls in the
        same round trip, on the same connection (on a cluster, on each node the calls
        reached: :mod:`.cluster_wait`); :attr:`confirmed` then holds the fewest replicas
        that confirmed the calls that succeeded (None if none did).
        """
        self.confirmed = None
        if not self._calls:
            return []
        results = self._send(self._calls, wait)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            for name in {self._calls[i][0] for i in missing}:
                self._client.script_load(load_script(name).source)
            again = self._send([self._calls[i] for i in missing], wait)
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        if any(isinstance(r, ReadOnlyError) for r in results):
            drop_demoted(self._client)
        if raise_on_error:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results

    def _send(self, calls: list[tuple[str, list[str], list[Any]]],
              wait: tuple[int, int] | None = None) -> list[Any]:
        # execute_command, not evalsha(): redis-py's cluster pipeline refuses the
        # evalsha() method but routes an EVALSHA command by its keys' slot.
        commands = [("EVALSHA", load_script(name).sha, len(keys), *keys, *args)
                    for name, keys, args in calls]
        if wait is not None and is_cluster_client(self._client):
            results, counts = send_and_wait(
                self._client, [(keys[0], command)
                               for (_, keys, _), command in zip(calls, commands, strict=True)],
                wait)
            self._confirm([count for result, count in zip(results, counts, strict=True)
                           if not isinstance(result, Exception)])
            return results
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        if wait is not None:
            pipe.execute_command(*wait_command(*wait))
        results = list(pipe.execute(raise_on_error=False))
        if wait is not None:
            confirmed = results.pop()
            if isinstance(confirmed, Exception):
                raise confirmed
            self._confirm([int(confirmed)])
        return results

    def _confirm(self, counts: list[int]) -> None:
        """Lower :attr:`confirmed` to the fewest of ``counts`` (replicas per call sent)."""
        if counts:
            low = min(counts)
            self.confirmed = low if self.confirmed is None else min(self.confirmed, low)
