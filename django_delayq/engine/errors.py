"""Exceptions raised by django-delayq. All derive from :class:`DelayQError`."""

from __future__ import annotations


class DelayQError(Exception):
    """Base class of every django-delayq error."""


class DelayQConnectionError(DelayQError, ConnectionError):
    """Redis could not be reached (or answered too slowly) for a queue operation."""


class JobNotFound(DelayQError, LookupError):
    """No job with this id exists in this queue (never enqueued, or expired)."""


class InvalidJobState(DelayQError):
    """The job's status does not allow the operation (cancelling a running job, say)."""


class PayloadTooLarge(DelayQError, ValueError):
    """The encoded arguments of a job exceed the configured size limit."""


class UnknownTask(DelayQError, LookupError):
    """No task with this name is registered."""
