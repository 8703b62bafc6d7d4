"""The API's pages for people: every endpoint as HTML, the root, the schema, Swagger UI
and ReDoc served without a CDN."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db

API = "/api/delayq"
HTML = {"HTTP_ACCEPT": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


@pytest.fixture
def browser() -> Client:
    """A signed-in staff member with the Job model permissions the API asks for, whose
    requests say what a browser says."""
    client = Client()
    user = User.objects.create_user("staff", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_delayq",
        codename__in=("view_job", "add_job", "change_job")))
    client.force_login(user)
    return client


def html_pages() -> list[str]:
    job = record.using(delay=3600).enqueue("page")
    return ["/", "/queues/", "/queues/default/", "/queues/default/pause/",
            "/queues/default/resume/", "/jobs/", f"/jobs/default/{job.id}/",
            f"/jobs/default/{job.id}/cancel/", f"/jobs/default/{job.id}/retry/",
            f"/jobs/default/{job.id}/reschedule/", "/workers/", "/schema/"]


def test_every_endpoint_is_a_browsable_page(browser: Client) -> None:
    for path in html_pages():
        response = browser.get(API + path, **HTML)
        # GET on an action answers 405, drawn on the page with the action's form.
        assert response.status_code in (200, 405), (path, response.content[:500])
        assert response["Content-Type"].startswith("text/html"), path
        assert b"Django REST framework" in response.content, path


def test_action_pages_offer_the_form_of_their_body(browser: Client) -> None:
    job = record.using(delay=3600).enqueue("form")
    body = browser.get(f"{API}/jobs/default/{job.id}/reschedule/", **HTML).content.decode()
    assert 'name="run_at"' in body
    assert 'name="delay"' in body
    body = browser.get(f"{API}/jobs/", **HTML).content.decode()
    assert 'name="task"' in body  # the enqueue form, not the job row's fields
    assert 'name="job_id"' in body


def test_root_lists_the_endpoints(browser: Client) -> None:
    body = browser.get(f"{API}/").json()
    assert body == {
        "queues": f"http://testserver{API}/queues/",
        "jobs": f"http://testserver{API}/jobs/",
        "workers": f"http://testserver{API}/workers/",
        "schema": f"http://testserver{API}/schema/",
        "swagger": f"http://testserver{API}/schema/swagger/",
        "redoc": f"http://testserver{API}/schema/redoc/",
    }
    for url in body.values():
        assert browser.get(url.removeprefix("http://testserver")).status_code == 200, url


def test_schema_is_shown_to_a_browser_and_a_file_to_tools(browser: Client) -> None:
    page = browser.get(f"{API}/schema/", **HTML)
    assert page["Content-Type"].startswith("text/html")
    assert "openapi: 3" in page.content.decode()
    tool = browser.get(f"{API}/schema/")
    assert tool["Content-Type"].startswith("application/vnd.oai.openapi")
    assert browser.get(f"{API}/schema/?format=json").json()["info"]["title"] == (
        "django-delayq API")


@pytest.mark.parametrize(("path", "assets"), [
    ("/schema/swagger/", ["swagger-ui-bundle.js", "swagger-ui-standalone-preset.js",
                          "swagger-ui.css"]),
    ("/schema/redoc/", ["redoc.standalone.js"]),
])
def test_docs_pages_load_their_assets_from_this_site(browser: Client, path: str,
                                                     assets: list[str]) -> None:
    body = browser.get(API + path).content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', body)
    assert not [s for s in sources if s.startswith(("http:", "https:", "//"))], sources
    for asset in assets:
        assert any(s.startswith("/static/drf_spectacular_sidecar/") and s.endswith(asset)
                   for s in sources), (asset, sources)
    assert f"{API}/schema/" in body  # the schema it draws


def test_docs_pages_are_refused_without_the_job_permissions(client: Client) -> None:
    client.force_login(User.objects.create_user("plain"))
    for path in ("/", "/schema/swagger/", "/schema/redoc/"):
        assert client.get(API + path).status_code == 403, path


def test_docs_pages_name_the_missing_app(browser: Client, settings: object) -> None:
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS  # type: ignore[attr-defined]
                               if a != "drf_spectacular_sidecar"]
    browser.raise_request_exception = True
    with pytest.raises(ImproperlyConfigured, match=r"'drf_spectacular_sidecar' in INSTALLED_APPS"):
        browser.get(f"{API}/schema/swagger/")
