"""The API's pages for people: every endpoint as HTML, the root, the schema, Swagger UI
and ReDoc served without a CDN."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from django_delayq import Job, Queue
from tests.conftest import ran, wait_until, worker_thread
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


class PostForm(HTMLParser):
    """The fields of the browsable API's HTML POST form, with the values it holds, as a
    browser would send them (a blank field is sent as "")."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self.enctype = ""
        self._inside = False
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("method") == "POST" and "enctype" in a:
            self._inside, self.enctype = True, a["enctype"] or ""
        elif self._inside and tag == "input" and a.get("name"):
            self.fields[a["name"] or ""] = a.get("value") or ""
        elif self._inside and tag == "textarea":
            self._textarea = a["name"] or ""
            self.fields[self._textarea] = ""
        elif self._inside and tag == "select":
            self.fields[a["name"] or ""] = ""

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.fields[self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None
        elif tag == "form":
            self._inside = False


def enqueue_form(browser: Client) -> PostForm:
    form = PostForm()
    form.feed(browser.get(f"{API}/jobs/", **HTML).content.decode())
    return form


def post_form(browser: Client, fields: dict[str, str], encoding: str) -> Any:
    """POST ``fields`` to the job list as the HTML form sends them."""
    if encoding == "multipart/form-data":  # the test client's own encoding of a dict
        return browser.post(f"{API}/jobs/", fields, **HTML)
    return browser.post(f"{API}/jobs/", urlencode(fields), content_type=encoding, **HTML)


def test_the_enqueue_form_offers_json_text_areas_and_a_typed_run_at(browser: Client) -> None:
    form = enqueue_form(browser)
    assert form.enctype == "multipart/form-data"
    assert {"task", "args", "kwargs", "queue", "priority", "delay", "run_at", "job_id",
            "max_attempts"} <= set(form.fields)
    assert (form.fields["args"].strip(), form.fields["kwargs"].strip()) == ("[]", "{}")
    body = browser.get(f"{API}/jobs/", **HTML).content.decode()
    # A date-time picker gives no UTC offset, which run_at needs: typed as text.
    assert re.search(r'<input name="run_at"[^>]*type="text"', body), body
    assert "Lists are not currently supported" not in body
    assert "Dictionaries are not currently supported" not in body


@pytest.mark.parametrize("encoding", ["multipart/form-data",
                                      "application/x-www-form-urlencoded"])
def test_the_enqueue_form_as_a_browser_fills_it_runs_the_job(
        browser: Client, redis_client: Any, encoding: str) -> None:
    fields = enqueue_form(browser).fields
    fields.update(task=record.name, args='["from the form"]',
                  kwargs='{"extra": {"n": 1, "tags": ["a", "b"]}}', priority="7",
                  job_id=f"form-{encoding.split('/')[1]}", max_attempts="2")
    response = post_form(browser, fields, encoding)
    assert response.status_code == 201, response.content[:2000]
    job = Job.fetch(fields["job_id"], "default")
    assert (job.args, job.kwargs, job.priority, job.max_attempts) == (
        ["from the form"], {"extra": {"n": 1, "tags": ["a", "b"]}}, 7, 2)
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: Job.fetch(job.id, "default").status == "completed")
    assert [(r["tag"], r["extra"]) for r in ran(redis_client)] == [
        ("from the form", {"n": 1, "tags": ["a", "b"]})]


@pytest.mark.parametrize(("args", "kwargs", "field", "text"), [
    ('["unclosed"', "{}", "args", "Not valid JSON"),
    ("['single quotes']", "{}", "args", "Not valid JSON"),
    ("[NaN]", "{}", "args", "Not valid JSON"),
    ("[" * 50_000 + "]" * 50_000, "{}", "args", "nested too deeply"),
    ('"a string"', "{}", "args", "Expected a list"),
    ('["a"]', '["x"]', "kwargs", "Expected a dictionary"),
    ('["a"]', "{extra: 1}", "kwargs", "Not valid JSON"),
    ("", "", "args", "missing a required argument"),  # blank: no arguments at all
])
def test_the_enqueue_form_answers_bad_json_with_a_400_by_field(
        browser: Client, args: str, kwargs: str, field: str, text: str) -> None:
    fields = {**enqueue_form(browser).fields, "task": record.name, "args": args,
              "kwargs": kwargs}
    response = browser.post(f"{API}/jobs/", fields)
    assert response.status_code == 400, response.content[:2000]
    assert text in str(response.json()[field]), response.json()
    page = browser.post(f"{API}/jobs/", fields, **HTML)
    assert page.status_code == 400
    assert text in page.content.decode()  # shown to the person who filled the form
    assert not any(Queue("default").counts().values())


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
