from django.contrib import admin
from django.urls import include, path

from tests.testapp import port_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/delayq/", include("django_delayq.api.urls")),
    path("metrics/delayq/", include("django_delayq.metrics.urls")),
    # the views of the django-tasks backport's tests (tests/test_django_tasks_port_workers.py)
    path("meaning-of-life/", port_views.calculate_meaning_of_life, name="meaning-of-life"),
    path("meaning-of-life-async/", port_views.calculate_meaning_of_life_async,
         name="meaning-of-life-async"),
    path("result/<str:result_id>", port_views.get_task_result, name="result"),
]
