"""Loads the Lua scripts (one ``.lua`` file per operation) and runs them by SHA.

Only :mod:`~django_delayq.engine.commands` calls these, with each script's KEYS and ARGV.

A script names what it includes, one line each: ``-- include: name`` stands for
``lua/includes/name.lua``, a file of definitions on one concept, which may name its own
includes. A script's source is its includes, each once and after those it names, then
its own file. Redis runs a script's whole body on every call, so each ``local function``
sent costs a closure per call whether used or not (about 2 us per call for all of them):
the includes are small so that a script takes only what it uses, and
``tests/test_scripts.py`` checks that it uses all it takes. Scripts are sent with
EVALSHA; when Redis answers NOSCRIPT (a restart, SCRIPT FLUSH, a failover) the script is
loaded again and the call repeated, for single calls and pipelines alike.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

from .cluster_wait import send_and_wait
from .failover import UNAVAILABLE, drop_demoted, follow_primary, in_script
from .pinned import PinnedConnections


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, full source and SHA1."""

    name: str
    source: str
    sha: str


#: A line naming an include: ``-- include: name`` (``lua/includes/name.lua``).
INCLUDE = re.compile(r"^-- include: ([a-z_]+)$", re.MULTILINE)
#: Scripts loaded from another script's file, leaving some of its includes out: name ->
#: (that file's name, the includes left out). ``enqueue_plain`` is ``enqueue.lua``
#: without the workflow definitions: the script reaches them only for jobs that wait for
#: parents (``m > 0``), and the closures they make are 5.5 % of the Redis instructions
#: of a one-job enqueue (callgrind). Only :mod:`.commands` chooses it
#: (``_enqueue_script``), for the enqueue calls with no such job.
VARIANTS = {"enqueue_plain": ("enqueue", frozenset({"flows", "link_parent"}))}


@cache
def read_lua(path: str) -> str:
    """The text of ``lua/<path>``."""
    return resources.files("django_delayq").joinpath("lua", path).read_text(encoding="utf-8")


def includes_of(name: str, leave_out: frozenset[str] = frozenset()) -> list[str]:
    """The includes ``<name>.lua`` names, with theirs, each once and after the ones it
    names (the order its source takes them in), but those of ``leave_out``."""
    order: list[str] = []

    def visit(text: str, path: tuple[str, ...]) -> None:
        for include in INCLUDE.findall(text):
            if include in path:
                raise ValueError(f"Lua includes name each other: {' -> '.join(path)}"
                                 f" -> {include}")
            if include not in order and include not in leave_out:
                visit(read_lua(f"includes/{include}.lua"), (*path, include))
                order.append(include)

    visit(read_lua(f"{name}.lua"), (name,))
    return order


@cache
def load_script(name: str) -> Script:
    """Return the script ``name``: ``lua/<name>.lua`` after its includes (for a name of
    :data:`VARIANTS`, its file without the includes it leaves out)."""
    file, leave_out = VARIANTS.get(name, (name, frozenset()))
    parts = [read_lua(f"includes/{include}.lua") for include in includes_of(file, leave_out)]
    source = "\n".join([*parts, read_lua(f"{file}.lua")])
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def load_everywhere(client: Any, name: str) -> None:
    """Load the script ``name`` where its calls may go: the server, or on a cluster
    every node the client knows, replicas included. A replica has no script cache of
    its primary (scripts are not replicated): once promoted (``CLUSTER FAILOVER``, a
    failover) it answers NOSCRIPT, and the client may follow a slot's redirect to it
    before its list of primaries names it, so a load sent to that list would miss it.

    Node by node: a node that is down cannot serve the call either, and it answers
    NOSCRIPT (and is loaded then) once back, so it does not keep the others from the
    script. Only when no node took it is the last error raised."""
    source = load_script(name).source
    if not is_cluster_client(client):
        client.script_load(source)
        return
    nodes, failed = client.get_nodes(), []
    for node in nodes:
        try:
            client.execute_command("SCRIPT LOAD", source, target_nodes=node)
        except UNAVAILABLE as exc:
            failed.append(exc)
    if nodes and len(failed) == len(nodes):
        raise failed[-1]


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
        load_everywhere(client, name)
        return run("EVALSHA", script.sha, len(keys), *keys, *args)
    except ReadOnlyError:
        drop_demoted(client, pinned)
        raise
    except ResponseError as exc:  # Redis 6.2: a command's error wrapped in the script's
        own = in_script(exc)
        if own is exc:
            raise
        if isinstance(own, ReadOnlyError):
            drop_demoted(client, pinned)
        raise own from exc


def script_command(name: str, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
    """The EVALSHA of one script call, for a pipeline that mixes script calls with other
    commands (:func:`execute_loading` sends it). On a cluster it is routed by its keys."""
    return ("EVALSHA", load_script(name).sha, len(keys), *keys, *args)


def execute_loading(client: Any, fill: Callable[[Any], None], names: Iterable[str]) -> list[Any]:
    """Send the pipeline ``fill`` builds, whose script calls are of ``names``: when Redis
    answers NOSCRIPT (a restart, a failover) the scripts are loaded and the pipeline is
    sent once more. The first error any command answered is raised."""
    for loaded in (False, True):
        pipe = client.pipeline(transaction=False)
        fill(pipe)
        replies = [in_script(r) if isinstance(r, Exception) else r
                   for r in pipe.execute(raise_on_error=False)]
        if not loaded and any(isinstance(r, NoScriptError) for r in replies):
            for name in set(names):
                load_everywhere(client, name)
            continue
        if any(isinstance(r, ReadOnlyError) for r in replies):
            drop_demoted(client)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        break
    return replies


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
        load_everywhere(client, name)
        reply, confirmed = send()
    reply = in_script(reply) if isinstance(reply, Exception) else reply
    for result in (reply, confirmed):
        if isinstance(result, ReadOnlyError):
            drop_demoted(client, pinned)
        if isinstance(result, Exception):
            raise result
    follow_primary(client, pinned)
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
                load_everywhere(self._client, name)
            again = self._send([self._calls[i] for i in missing], wait)
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        results = [in_script(r) if isinstance(r, Exception) else r for r in results]
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
            follow_primary(self._client)
            self._confirm([int(confirmed)])
        return results

    def _confirm(self, counts: list[int]) -> None:
        """Lower :attr:`confirmed` to the fewest of ``counts`` (replicas per call sent)."""
        if counts:
            low = min(counts)
            self.confirmed = low if self.confirmed is None else min(self.confirmed, low)
