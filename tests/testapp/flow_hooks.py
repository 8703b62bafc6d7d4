"""Test hook for worker processes started by tests/test_workflows.py (off unless asked).

``DELAYQ_TEST_CRASH_AT=<step>`` SIGKILLs the worker at that step of a workflow release
delivered across shards (``engine.flows.deliver``), so the crash-point tests can kill it
between two of its round trips:

- ``deliver:read``: the outbox entries read, before their resolutions are sent;
- ``deliver:resolved``: the resolutions landed, before the entries are removed;
- ``deliver:removed``: the entries removed.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

STEP = os.environ.get("DELAYQ_TEST_CRASH_AT", "")
STEPS = ("deliver:read", "deliver:resolved", "deliver:removed")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(step: str) -> None:
    from django_delayq.engine import flows

    if step not in STEPS:
        raise ValueError(f"DELAYQ_TEST_CRASH_AT={step!r}: not one of {STEPS}")
    if step == "deliver:removed":
        original_deliver = flows.deliver

        def deliver_then_die(*args: Any, **kwargs: Any) -> int:
            delivered = original_deliver(*args, **kwargs)
            if delivered:
                _die()
            return delivered

        flows.deliver = deliver_then_die  # type: ignore[assignment]
        return
    original_resolve = flows._resolve

    def resolve_with_a_crash(*args: Any, **kwargs: Any) -> None:
        from_delivery = sys._getframe(1).f_code.co_name == "deliver"
        if from_delivery and step == "deliver:read":
            _die()
        original_resolve(*args, **kwargs)
        if from_delivery:
            _die()

    flows._resolve = resolve_with_a_crash  # type: ignore[assignment]


if STEP:
    _install(STEP)
