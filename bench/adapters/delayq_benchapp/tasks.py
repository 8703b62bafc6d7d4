"""The two benchmark jobs, as every other library runs them (see ``common``)."""

from __future__ import annotations

import common

from django_delayq import task


@task(queue="bench", max_attempts=1)
def noop() -> None:
    common.mark_done()


@task(queue="bench", max_attempts=1)
def late(due_us: int) -> None:
    common.mark_late(due_us)
