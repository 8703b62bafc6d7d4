"""The export thread that ``delayq_mirror`` (and so ``runworker``'s mirror process) runs
when ``DELAYQ["LAKE_PATH"]`` is set (off by default), or ``runworker`` itself when it has
no mirror process."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..conf import conf
from ..connection import get_broker

if TYPE_CHECKING:
    from .export import ExportThread

logger = logging.getLogger(__name__)


def start_export_thread() -> ExportThread | None:
    """Start an export thread to ``LAKE_PATH``; ``None`` when the setting is unset or
    PyArrow is missing (logged)."""
    where = conf.LAKE_PATH
    if where is None:
        return None
    try:
        from .export import ExportThread
    except ImportError as exc:
        logger.error("the lake export is off: %s (pip install 'django-delayq[spark]')", exc)
        return None
    broker = get_broker(socket_timeout=1.0 + conf.SOCKET_TIMEOUT)
    return ExportThread(where, broker=broker).start()
