"""Hypothesis profiles of the fuzz suite: ``default`` (a quick run inside ``make test``)
and ``fuzz`` (``make fuzz``: many more examples). Choose with ``HYPOTHESIS_PROFILE``."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

_COMMON: dict[str, Any] = {
    "deadline": None,  # the machine is shared: time is no property
    "database": None,  # nothing written to the work tree
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                              HealthCheck.data_too_large],
    "print_blob": True,
}
settings.register_profile("default", max_examples=50, stateful_step_count=20, **_COMMON)
settings.register_profile("fuzz", max_examples=300, stateful_step_count=40, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Examples run per test in this session (reported at the end, for docs/guarantees.md).
EXAMPLES: dict[str, int] = {}


def count_example(name: str) -> None:
    EXAMPLES[name] = EXAMPLES.get(name, 0) + 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if EXAMPLES:
        terminalreporter.write_line(
            f"fuzz examples run (profile {settings.get_current_profile_name()}): "
            + ", ".join(f"{name} {n}" for name, n in sorted(EXAMPLES.items()))
            + f"; total {sum(EXAMPLES.values())}")
