"""URL of the metrics view: ``path("metrics/delayq/", include("django_delayq.metrics.urls"))``."""

from __future__ import annotations

from django.urls import path

from . import metrics_view

app_name = "delayq-metrics"

urlpatterns = [path("", metrics_view, name="metrics")]
