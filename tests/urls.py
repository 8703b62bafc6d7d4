from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/delayq/", include("django_delayq.api.urls")),
    path("metrics/delayq/", include("django_delayq.metrics.urls")),
]
