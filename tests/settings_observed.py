"""The test settings with the JSON logging recipe of docs/observability.md (its code,
read from the page) and, when ``DELAYQ_TEST_SPANS`` names a file, an OpenTelemetry
tracer provider that writes each finished span to it as one JSON line."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.settings import *  # noqa: F403

_PAGE = (Path(__file__).resolve().parent.parent / "docs" / "observability.md").read_text()
_RECIPE = re.search(r"```python\n# myproject/logs.py\n(.*?)```", _PAGE, re.S)
assert _RECIPE is not None, "the JSON logging recipe of docs/observability.md"
exec(compile(_RECIPE.group(1), "docs/observability.md", "exec"))  # defines JSONFormatter

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "tests.settings_observed.JSONFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json"}},
    "loggers": {"django_delayq": {"handlers": ["stderr"], "level": "INFO"}},
}

if os.environ.get("DELAYQ_TEST_SPANS"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=open(os.environ["DELAYQ_TEST_SPANS"], "a", buffering=1),  # noqa: SIM115
        formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(_provider)
