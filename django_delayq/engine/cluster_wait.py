"""Script calls followed by Redis ``WAIT`` on a Redis Cluster: one connection per node.

``WAIT`` counts the replicas that have the writes of the connection it is sent on.
redis-py's cluster client checks a connection out of the node's pool for each command,
so a ``WAIT`` sent apart from the script it confirms may run on another connection: one
whose own writes the replicas have already (or a new one, with none), which confirms a
write no replica has. Here the calls meant for one node and their ``WAIT`` go down one
pipeline of that node's client: one connection, in order.

Redirects are followed as the cluster client would: after ``MOVED`` the node table is
read again and the call goes to the new owner of its slot; after ``ASK`` it goes to the
importing node behind ``ASKING``; at most :data:`MAX_REDIRECTS` times. A node that cannot
be reached, or answers ``READONLY`` (a demoted primary) or ``CLUSTERDOWN``, makes the node
table be read again; its error takes the place of its calls' replies, for the broker's
failover retry (``TRYAGAIN`` too: the slot is moving).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .fastpaths import reread_cluster_nodes
from .logfields import log

#: Redirects (MOVED, ASK) one call may follow before its reply is an error.
MAX_REDIRECTS = 5

logger = logging.getLogger(__name__)


def send_and_wait(
    client: Any, calls: Sequence[tuple[str, tuple[Any, ...]]], wait: tuple[int, int],
) -> tuple[list[Any], list[int]]:
    """Send each ``(key, command)`` of ``calls`` to the primary serving ``key``, and on
    each node ``WAIT`` for ``wait = (replicas, timeout_ms)`` on the same connection.

    Returns the replies in call order (an error in the place of a call that failed) and,
    per call, how many replicas confirmed the writes of its node's connection (0 for a
    call that failed).
    """
    replies: list[Any] = [None] * len(calls)
    confirmed = [0] * len(calls)
    todo: list[tuple[int, Any]] = [(index, None) for index in range(len(calls))]
    for _ in range(MAX_REDIRECTS + 1):
        by_node: dict[str, tuple[Any, list[tuple[int, bool]]]] = {}
        for index, asked in todo:
            try:
                node = asked or client.get_node_from_key(calls[index][0])
            except RedisClusterException as exc:  # its slot is not covered (a failover)
                replies[index] = ClusterError(str(exc))
                continue
            by_node.setdefault(node.name, (node, []))[1].append((index, asked is not None))
        todo, reread = [], False
        for node, sent in by_node.values():
            answers, count = _send_to_node(client, node, [calls[i][1] for i, _ in sent],
                                           [asking for _, asking in sent], wait)
            for (index, _), answer in zip(sent, answers, strict=True):
                if isinstance(answer, MovedError):
                    reread = True
                    todo.append((index, None))
                elif isinstance(answer, AskError):
                    target = client.get_node(host=answer.host, port=answer.port)
                    if target is None:  # a node this client has not met: read the table
                        reread = True
                    todo.append((index, target))
                else:
                    if isinstance(answer, ReadOnlyError | ClusterDownError
                                  | RedisConnectionError | RedisTimeoutError):
                        reread = True
                    replies[index] = answer
                    confirmed[index] = 0 if isinstance(answer, Exception) else count
        if reread:
            _reread(client)
        if not todo:
            return replies, confirmed
    for index, _ in todo:
        replies[index] = ClusterError(f"the slot of {calls[index][0]!r} kept moving "
                                      f"({MAX_REDIRECTS} redirects)")
    return replies, confirmed


def _send_to_node(client: Any, node: Any, commands: list[tuple[Any, ...]],
                  asking: list[bool], wait: tuple[int, int]) -> tuple[list[Any], int]:
    """``commands`` and ``WAIT`` in one pipeline (one connection) of ``node``'s client:
    their replies (or the error that stopped the pipeline, in each place) and the count
    ``WAIT`` returned (0 if it failed)."""
    pipe = client.get_redis_connection(node).pipeline(transaction=False)
    for command, ask in zip(commands, asking, strict=True):
        if ask:
            pipe.execute_command("ASKING")  # lets the next command into a slot importing
        pipe.execute_command(*command)
    pipe.execute_command("WAIT", *wait)
    try:
        results = list(pipe.execute(raise_on_error=False))
    except (RedisConnectionError, RedisTimeoutError) as exc:
        return [exc] * len(commands), 0
    count = results.pop()
    answers = [result for result, skip in zip(results, _asking_marks(asking), strict=True)
               if not skip]
    return answers, 0 if isinstance(count, Exception) else int(count)


def _asking_marks(asking: list[bool]) -> list[bool]:
    """Per pipeline reply before ``WAIT``: whether it is an ``ASKING``'s (to drop)."""
    marks: list[bool] = []
    for ask in asking:
        marks += [True, False] if ask else [False]
    return marks


def _reread(client: Any) -> None:
    try:
        reread_cluster_nodes(client)
    except Exception as exc:  # no node answers now: the next try reads it again
        log(logger, logging.DEBUG, "could not read the Redis Cluster's node table", error=exc)
