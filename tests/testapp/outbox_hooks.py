"""Test hooks for relay processes started by tests/test_outbox.py (off unless asked).

``DELAYQ_TEST_RELAY_HOOK=hold:<tag>``: the relay's first round, holding the lock on
its rows, pushes its pid to ``relay:held:<tag>`` and waits for ``relay:gate:<tag>``
(at most 60 s) before sending them.
``DELAYQ_TEST_RELAY_HOOK=announce:<tag>``: the relay pushes its pid to
``relay:stepping:<tag>`` before its first round.
"""

from __future__ import annotations

import os
from typing import Any

HOOK = os.environ.get("DELAYQ_TEST_RELAY_HOOK", "")


def _install(kind: str, tag: str) -> None:
    from django_delayq.connection import get_broker
    from django_delayq.outbox import relay

    first = [True]
    if kind == "hold":
        original_send = relay.send_rows

        def held_send(*args: Any, **kwargs: Any) -> Any:
            if first[0]:
                first[0] = False
                client = get_broker(socket_timeout=70).client  # BLPOP waits up to 60 s
                client.rpush(f"relay:held:{tag}", os.getpid())
                if not client.blpop([f"relay:gate:{tag}"], timeout=60):
                    raise TimeoutError(f"relay:gate:{tag} never opened")
            return original_send(*args, **kwargs)

        relay.send_rows = held_send  # type: ignore[assignment]
    elif kind == "announce":
        original_step = relay.Relay.step

        def announced_step(self: Any) -> Any:
            if first[0]:
                first[0] = False
                get_broker().client.rpush(f"relay:stepping:{tag}", os.getpid())
            return original_step(self)

        relay.Relay.step = announced_step  # type: ignore[method-assign]


if HOOK:
    _kind, _, _tag = HOOK.partition(":")
    _install(_kind, _tag)
