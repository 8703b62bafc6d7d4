"""The Redis connection and the engine :class:`Broker` built from ``settings.DELAYQ``.

Importing this module registers Django's lazy strings with the engine's JSON codec
(:func:`django_delayq.engine.codec.register`): every broker of the Django layer is built
here, so a lazy translation is encoded as its text wherever a job is enqueued.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.functional import Promise

from .conf import conf, given, replaced
from .engine import Broker, EngineConfig, codec
from .engine.urls import client_from_url, client_like

codec.register(Promise, str)

_lock = threading.Lock()
_brokers: dict[float | None, Broker] = {}


def engine_config() -> EngineConfig:
    """The :class:`EngineConfig` for the current settings: the one place the Django layer
    builds it (workers, producers, Spark's driver, which ships it to the executors)."""
    user = given()
    problems = [problem for _name, _check_id, problem in replaced(user)]
    if problems:  # refused here too: a process that skips the checks must not guess
        raise ImproperlyConfigured(" ".join(problems))
    try:
        return EngineConfig.from_settings(user)
    except ValueError as exc:
        raise ImproperlyConfigured(f"settings.DELAYQ: {exc}") from exc


def _client_kwargs(socket_timeout: float) -> dict[str, Any]:
    return {
        "decode_responses": True,
        # Bytes that are not UTF-8 (a damaged job) decode to U+FFFD and then fail that
        # job's JSON decoding, instead of raising in the middle of a worker's claim.
        "encoding_errors": "replace",
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": conf.SOCKET_CONNECT_TIMEOUT,
        "health_check_interval": 30,
    }


def make_client(socket_timeout: float | None = None) -> Any:
    """A new redis-py client for the configured Redis (``decode_responses=True``)."""
    timeout = conf.SOCKET_TIMEOUT if socket_timeout is None else socket_timeout
    alias = conf.CACHE_ALIAS
    if alias:
        try:  # django-redis: an optional extra, imported only when CACHE_ALIAS names it
            from django_redis import get_redis_connection
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImproperlyConfigured(
                "DELAYQ['CACHE_ALIAS'] needs django-redis: "
                "pip install 'django-delayq[django-redis]'"
            ) from exc
        # the cache's server (or Sentinel service), with this app's own options
        return client_like(get_redis_connection(alias), **_client_kwargs(timeout))
    return client_from_url(conf.REDIS_URL, **_client_kwargs(timeout))


def get_broker(*, socket_timeout: float | None = None) -> Broker:
    """The shared :class:`Broker` for the current settings.

    Built on first use and kept until the ``DELAYQ`` or ``CACHES`` setting changes
    (``override_settings`` and the ``settings`` test fixture send that signal).
    """
    broker = _brokers.get(socket_timeout)
    if broker is None:
        with _lock:
            broker = _brokers.get(socket_timeout)
            if broker is None:
                broker = Broker(make_client(socket_timeout), engine_config())
                _brokers[socket_timeout] = broker
    return broker


def reset() -> None:
    """Forget every broker (their connections close); the next use connects again."""
    with _lock:
        for broker in _brokers.values():
            with contextlib.suppress(Exception):
                broker.close()
        _brokers.clear()


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DELAYQ", "CACHES"):
        reset()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_delayq.connection")
