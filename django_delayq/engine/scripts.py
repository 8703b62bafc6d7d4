"""Loads the Lua scripts (one ``.lua`` file per operation) and runs them by SHA.

Each script is the shared ``includes/common.lua`` followed by its own file. Scripts are
sent with EVALSHA; when Redis answers NOSCRIPT (a restart, SCRIPT FLUSH, a failover) the
script is loaded again and the call repeated, for single calls and pipelines alike.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from .held import HeldConnections

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "complete",
    "fail",
    "extend",
    "reclaim",
    "release",
    "cancel",
    "reschedule",
    "retry",
    "purge",
    "reserve",
    "advance_schedule",
)


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, full source and SHA1."""

    name: str
    source: str
    sha: str


def _read(path: str) -> str:
    return resources.files("django_delayq").joinpath("lua", path).read_text(encoding="utf-8")


@cache
def load_script(name: str) -> Script:
    """Return the script ``name`` (``lua/<name>.lua`` after the shared includes)."""
    source = _read("includes/common.lua") + "\n" + _read(f"{name}.lua")
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def call(
    client: Any, name: str, keys: list[str], args: list[Any], held: HeldConnections | None = None
) -> Any:
    """Run one script on ``client``, loading it first if Redis does not know it.

    With ``held`` (connections of ``client``'s pool), the call skips the pool checkout.
    """
    script = load_script(name)
    # EVALSHA through execute_command: a cluster client routes it by its keys' slot.
    run = client.execute_command if held is None else held.execute
    try:
        return run("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.source)
        return run("EVALSHA", script.sha, len(keys), *keys, *args)


class Batch:
    """Script calls sent together in one pipeline: one round trip for the lot.

    ``run()`` returns the results in call order. Calls that failed with NOSCRIPT are
    loaded and sent again; any other error is raised after every call has run.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._calls: list[tuple[str, list[str], list[Any]]] = []

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, name: str, keys: list[str], args: list[Any]) -> int:
        self._calls.append((name, keys, args))
        return len(self._calls) - 1

    def run(self, *, raise_on_error: bool = True) -> list[Any]:
        """The replies in call order. With ``raise_on_error`` False, a call that failed
        leaves its exception in its place instead of raising it (the other calls have
        run: a caller that must not lose their effects reads them)."""
        if not self._calls:
            return []
        results = self._send(self._calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            for name in {self._calls[i][0] for i in missing}:
                self._client.script_load(load_script(name).source)
            again = self._send([self._calls[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        if raise_on_error:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results

    def _send(self, calls: list[tuple[str, list[str], list[Any]]]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for name, keys, args in calls:
            # execute_command, not evalsha(): redis-py's cluster pipeline refuses the
            # evalsha() method but routes an EVALSHA command by its keys' slot.
            pipe.execute_command("EVALSHA", load_script(name).sha, len(keys), *keys, *args)
        return list(pipe.execute(raise_on_error=False))
