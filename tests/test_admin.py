"""The admin: job list, job page, actions, queues dashboard, permissions, escaping."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client, override_settings
from django.urls import reverse

from django_delayq import Job as EngineJob
from django_delayq import Queue
from django_delayq.engine.fields import stored
from django_delayq.engine.keys import GlobalKeys, QueueKeys
from django_delayq.mirror import Mirror
from django_delayq.models import Job
from tests.conftest import round_trips, wait_until, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_delayq_job_changelist"
DASHBOARD = "admin:django_delayq_queues"
XSS = "<script>alert(1)</script>"


def mirror() -> None:
    Mirror(block=0.1).run(burst=True)


def control(queue: str, operation: str) -> str:
    return reverse("admin:django_delayq_queue_control", args=[queue, operation])


def change_url(job_id: str, queue: str = "default") -> str:
    row = Job.objects.get(job_id=job_id, queue=queue)
    return reverse("admin:django_delayq_job_change", args=[row.pk])


def act(client: Client, action: str, *job_ids: str) -> tuple[Any, list[str]]:
    pks = [str(Job.objects.get(job_id=j).pk) for j in job_ids]
    response = client.post(reverse(CHANGELIST), {"action": action, "_selected_action": pks},
                           follow=True)
    return response, [str(m) for m in get_messages(response.wsgi_request)]


def staff(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def run_to_end(*jobs: EngineJob) -> None:
    with worker_thread(queues=sorted({j.queue for j in jobs})):
        wait_until(lambda: all(j.refresh().is_finished for j in jobs), message="jobs to finish")


# -- access -------------------------------------------------------------------------------

def test_anonymous_is_sent_to_the_login_page(client):
    for url in (reverse(CHANGELIST), reverse(DASHBOARD), control("default", "purge")):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    response = client.post(control("default", "pause"))
    assert response.status_code == 302
    assert not Queue("default").is_paused


def test_staff_with_view_permission_sees_but_cannot_act(client):
    job = tasks.record.using(delay=3600).enqueue("v")
    mirror()
    client.force_login(staff("viewer", "view_job"))
    page = client.get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert job.id in page.content.decode()
    assert "retry_jobs" not in page.content.decode()
    _, msgs = act(client, "cancel_jobs", job.id)
    assert not any("cancelled" in m for m in msgs)
    assert job.refresh().status == "scheduled"
    dashboard = client.get(reverse(DASHBOARD))
    assert dashboard.status_code == 200
    assert "button dq-pause" not in dashboard.content.decode()
    assert client.post(control("default", "pause")).status_code == 403
    assert client.get(control("default", "purge")).status_code == 403
    assert not Queue("default").is_paused


def test_staff_without_permissions_sees_nothing(client):
    client.force_login(staff("nobody"))
    assert client.get(reverse(CHANGELIST)).status_code == 403
    assert client.get(reverse(DASHBOARD)).status_code == 403


def test_staff_with_change_permission_can_act(client):
    job = tasks.record.using(delay=3600).enqueue("c")
    mirror()
    client.force_login(staff("operator", "view_job", "change_job"))
    _, msgs = act(client, "cancel_jobs", job.id)
    assert msgs == [f"1 job(s) cancelled: {job.id}"]
    assert job.refresh().status == "cancelled"
    # purging deletes jobs: not without delete_job
    dashboard = client.get(reverse(DASHBOARD)).content.decode()
    assert "button dq-pause" in dashboard
    assert 'class="button dq-purge"' not in dashboard
    assert client.get(control("default", "purge")).status_code == 403
    client.force_login(staff("purger", "view_job", "change_job", "delete_job"))
    assert 'class="button dq-purge"' in client.get(reverse(DASHBOARD)).content.decode()
    assert client.get(control("default", "purge")).status_code == 200


def test_csrf_is_enforced(admin_user):
    tasks.record.enqueue("x")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(control("default", "pause")).status_code == 403
    assert not Queue("default").is_paused
    page = client.get(reverse(DASHBOARD))
    token = page.cookies["csrftoken"].value
    response = client.post(control("default", "pause"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Queue("default").is_paused


# -- the job list -------------------------------------------------------------------------

def test_job_list_badges_filters_and_search(admin_client):
    first = tasks.record.using(delay=3600).enqueue("a")
    other = tasks.record_other.enqueue("b")
    failed = tasks.always_fails.enqueue("c")
    run_to_end(other, failed)
    mirror()
    url = reverse(CHANGELIST)
    page = admin_client.get(url).content.decode()
    for job in (first, other, failed):
        assert job.id in page
    assert 'class="dq-badge dq-status-scheduled"' in page
    assert "dq-status-failed" in page
    assert "dq-status-completed" in page
    assert "Queues dashboard" in page
    app_page = admin_client.get(reverse("admin:app_list", args=["django_delayq"])).content.decode()
    assert app_page.count("Queues dashboard") == 1, "the dashboard is listed once"
    assert ">Change<" not in app_page, "read-only pages are offered as View"
    entry = admin_client.get(reverse("admin:django_delayq_queuesdashboard_changelist"))
    assert entry.url == reverse(DASHBOARD)

    def ids(query: dict[str, str]) -> set[str]:
        response = admin_client.get(url, query)
        return {j for j in (first.id, other.id, failed.id) if j in response.content.decode()}

    assert ids({"status": "failed"}) == {failed.id}
    assert ids({"queue": "other"}) == {other.id}
    assert ids({"task_name": tasks.record.name}) == {first.id}
    assert ids({"q": first.id}) == {first.id}
    assert ids({"q": "always_fails"}) == {failed.id}
    year = first.run_at.year
    assert ids({"run_at__year": str(year)}) == {first.id, other.id, failed.id}


# -- the job page -------------------------------------------------------------------------

def test_job_page_shows_arguments_result_timings_traceback_and_live_state(admin_client):
    done = tasks.record.enqueue("page", extra={"n": 7})
    failed = tasks.always_fails.enqueue("tb")
    run_to_end(done, failed)
    mirror()
    page = admin_client.get(change_url(done.id)).content.decode()
    assert '<pre class="dq-pre">[\n  &quot;page&quot;\n]</pre>' in page
    assert "&quot;n&quot;: 7" in page
    assert "live in Redis" in page
    assert "<td>1/3</td><td>1/3</td>" in page  # mirrored and live attempts
    assert "duration" in page
    assert " s</div>" in page
    assert 'name="_save"' not in page
    page = admin_client.get(change_url(failed.id)).content.decode()
    assert "Traceback (most recent call last)" in page
    assert "boom tb" in page
    assert "3/3" in page
    assert "dq-status-failed" in page


def test_every_page_works_with_use_tz_off(admin_client):
    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Kolkata"):
        done = tasks.record.enqueue("page")
        failed = tasks.always_fails.enqueue("tb")
        later = tasks.record.using(delay=3600).enqueue("later")
        run_to_end(done, failed)
        mirror()
        assert Job.objects.count() == 3
        for url in (reverse("admin:django_delayq_job_changelist"), reverse(DASHBOARD),
                    change_url(done.id), change_url(failed.id), change_url(later.id),
                    reverse("admin:django_delayq_job_changelist") + "?status__exact=failed"):
            response = admin_client.get(url)
            assert response.status_code == 200, url
        page = admin_client.get(change_url(done.id)).content.decode()
        assert "dq-status-completed" in page


def test_job_page_of_a_job_gone_from_redis_says_so(admin_client, redis_client):
    job = tasks.record.enqueue("gone")
    run_to_end(job)
    mirror()
    redis_client.delete(QueueKeys("dq", "default").job(job.id))
    page = admin_client.get(change_url(job.id)).content.decode()
    assert "Not in Redis any more" in page


def test_the_job_page_is_read_only(admin_client):
    job = tasks.record.using(delay=3600).enqueue("ro")
    mirror()
    url = change_url(job.id)
    admin_client.post(url, {"status": "completed", "task_name": "evil"})
    row = Job.objects.get(job_id=job.id)
    assert (row.status, row.task_name) == ("scheduled", tasks.record.name)


# -- actions --------------------------------------------------------------------------------

def test_retry_action_retries_failed_jobs_and_reports_the_rest(admin_client):
    failed = tasks.always_fails.enqueue("r")
    done = tasks.record.enqueue("ok")
    run_to_end(failed, done)
    mirror()
    _, msgs = act(admin_client, "retry_jobs", failed.id, done.id)
    assert f"1 job(s) retried: {failed.id}" in msgs
    assert any(done.id in m and "is completed" in m and "not retried" in m for m in msgs)
    assert (failed.refresh().status, failed.attempts, failed.max_attempts) == ("ready", 3, 6)
    assert Job.objects.get(job_id=failed.id).status == "ready"


def test_cancel_action(admin_client, redis_client, caplog):
    waiting = tasks.record.using(delay=3600).enqueue("w")
    gone = tasks.record.using(delay=3600).enqueue("g")
    mirror()
    redis_client.delete(QueueKeys("dq", "default").job(gone.id))
    with caplog.at_level("INFO", logger="django_delayq"):
        _, msgs = act(admin_client, "cancel_jobs", waiting.id, gone.id)
    # who acted is named as the API names it: by username, not by primary key
    [record] = [r for r in caplog.records if r.getMessage().startswith("admin action")]
    assert (record.action, record.user, record.changed) == ("cancelled", "admin", 1)
    assert f"1 job(s) cancelled: {waiting.id}" in msgs
    assert any(f"{gone.id}: not in Redis any more" in m for m in msgs)
    assert waiting.refresh().status == "cancelled"
    assert Job.objects.get(job_id=waiting.id).status == "cancelled"


def test_an_action_on_a_row_whose_id_no_job_can_have_says_so(admin_client):
    """A damaged row (an id no job can have) is refused with the reason, beside the
    others: not a server error."""
    waiting = tasks.record.using(delay=3600).enqueue("w")
    mirror()
    Job.objects.create(queue="default", job_id="not an id", status="scheduled")
    response, msgs = act(admin_client, "cancel_jobs", waiting.id, "not an id")
    assert response.status_code == 200
    assert f"1 job(s) cancelled: {waiting.id}" in msgs
    assert any("not an id: invalid job id" in m for m in msgs), msgs


def test_run_now_action(admin_client):
    later = tasks.record.using(delay=3600).enqueue("later")
    cancelled = tasks.record.using(delay=3600).enqueue("c")
    cancelled.cancel()
    mirror()
    _, msgs = act(admin_client, "run_jobs_now", later.id, cancelled.id)
    assert f"1 job(s) moved to now: {later.id}" in msgs
    assert f"1 job(s) retried: {cancelled.id}" in msgs
    assert later.refresh().status == "ready"
    assert cancelled.refresh().status == "ready"
    with worker_thread(queues=["default"]):
        wait_until(lambda: later.refresh().status == "completed", message="run now to run")


def test_buttons_of_the_job_page(admin_client, client):
    job = tasks.record.using(delay=3600).enqueue("b")
    mirror()
    url = change_url(job.id)
    pk = Job.objects.get(job_id=job.id).pk
    page = admin_client.get(url).content.decode()
    assert "dq-act-cancel" in page
    assert "dq-act-run-now" in page
    act_url = reverse("admin:django_delayq_job_act", args=[pk, "cancel"])
    assert admin_client.get(act_url).status_code == 405
    response = admin_client.post(act_url, follow=True)
    assert response.redirect_chain[-1][0] == url
    assert f"1 job(s) cancelled: {job.id}" in response.content.decode()
    assert job.refresh().status == "cancelled"
    response = admin_client.post(reverse("admin:django_delayq_job_act", args=[pk, "retry"]),
                                 follow=True)
    assert f"1 job(s) retried: {job.id}" in response.content.decode()
    assert job.refresh().status == "ready"
    assert admin_client.post(reverse("admin:django_delayq_job_act",
                                     args=[pk, "explode"])).status_code == 404
    client.force_login(staff("viewer", "view_job"))
    assert "dq-act-cancel" not in client.get(url).content.decode()
    assert client.post(act_url).status_code == 403


def test_the_abort_button_stops_a_running_job_and_the_page_says_who(admin_client):
    job = tasks.gated.enqueue("ab", "gate:never")
    with worker_thread(queues=["default"], concurrency=1, lease=3):
        wait_until(lambda: job.refresh().status == "active", message="the job to start")
        mirror()
        url = change_url(job.id)
        assert "dq-act-abort" in admin_client.get(url).content.decode()
        pk = Job.objects.get(job_id=job.id).pk
        response = admin_client.post(reverse("admin:django_delayq_job_act", args=[pk, "abort"]),
                                     follow=True)
        assert f"1 job(s) asked to stop: {job.id}" in response.content.decode()
        wait_until(lambda: job.refresh().status == "cancelled", timeout=60,
                   message="the aborted job to end cancelled")
    mirror()
    row = Job.objects.get(job_id=job.id)
    assert (row.status, row.aborted_by) == ("cancelled", "admin (admin)")
    page = admin_client.get(url).content.decode()
    assert "admin (admin)" in page
    assert "dq-act-abort" not in page
    assert "dq-act-retry" in page


def test_search_finds_an_argument_value_and_the_live_view_serves_the_rows(admin_client):
    wanted = tasks.take_anything.enqueue("order-77321", customer="ada@example.com")
    other = tasks.take_anything.enqueue("order-1")
    mirror()
    for term in ("order-77321", "ada@example"):
        page = admin_client.get(reverse(CHANGELIST), {"q": term}).content.decode()
        assert wanted.id in page
        assert other.id not in page
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "Rows refresh every 3 seconds" in page
    pk = Job.objects.get(job_id=wanted.id).pk
    rows = admin_client.get(reverse("admin:django_delayq_job_live"),
                            {"pk": [pk], "live": "1"}).json()["rows"]
    assert rows[str(pk)]["status"] == "ready"
    assert rows[str(pk)]["live"]["status"] == "ready"
    assert "dq-status-ready" in rows[str(pk)]["cells"]["status_display"]


def test_a_manual_retry_is_marked_in_the_attempts_table(admin_client):
    job = tasks.always_fails.using(max_attempts=2).enqueue("twice")
    run_to_end(job)
    job.retry()
    run_to_end(job)
    mirror()
    page = admin_client.get(change_url(job.id)).content.decode()
    assert page.count('class="dq-retry-mark"') == 1
    assert "retried by hand: attempt 3 began a new budget" in page


def test_outbox_list_title(admin_client):
    page = admin_client.get(reverse("admin:django_delayq_outboxentry_changelist")).content
    assert b"<h1>Jobs waiting in the outbox</h1>" in page
    assert b"to change" not in page


def test_delayq_abort_command(redis_client, capsys):
    from django.core.management import call_command

    waiting = tasks.record.using(delay=3600).enqueue("w")
    # After "--": a generated id starts with '-' once in 64 (URL-safe base64).
    call_command("delayq_abort", "default", "--by", "cron", "--", waiting.id)
    assert capsys.readouterr().out == f"{waiting.id}: cancelled\n"
    assert (waiting.refresh().status, waiting.aborted_by) == ("cancelled", "cron")
    with pytest.raises(SystemExit) as exit_:
        call_command("delayq_abort", "default", "--", waiting.id, "missing")
    assert exit_.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{waiting.id}: cancelled already, not aborted", "missing: not in Redis"]


def test_delayq_abort_takes_an_id_that_starts_with_a_dash(redis_client, capsys):
    from django.core.management import call_command

    job = tasks.record.using(delay=3600, job_id="-dash-first").enqueue("w")
    call_command("delayq_abort", "default", "--", job.id)
    assert capsys.readouterr().out == "-dash-first: cancelled\n"
    assert job.refresh().status == "cancelled"


def test_action_with_redis_down_says_so_without_the_url(admin_client):
    job = tasks.record.using(delay=3600).enqueue("x")
    mirror()
    dead = {**settings.DELAYQ, "REDIS_URL": "redis://:s3cret-pw@127.0.0.1:1/0",
            "SOCKET_CONNECT_TIMEOUT": 0.2}
    with override_settings(DELAYQ=dead):
        response, msgs = act(admin_client, "cancel_jobs", job.id)
        page = admin_client.get(change_url(job.id)).content.decode()
        dashboard = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert any("Redis is unreachable" in m for m in msgs)
    assert "Redis is unreachable" in page
    assert "Redis is unreachable" in dashboard
    for text in (response.content.decode(), page, dashboard):
        assert "s3cret" not in text
        assert "127.0.0.1:1" not in text
    assert job.refresh().status == "scheduled"


# -- the dashboard --------------------------------------------------------------------------

def test_dashboard_shows_counts_state_throughput_and_workers(admin_client):
    done = [tasks.record.enqueue(f"d{i}") for i in range(3)]
    failed = tasks.always_fails.enqueue("f")
    tasks.record.using(delay=3600).enqueue("later")
    tasks.record_other.using(delay=60).enqueue("o")
    Queue("other").pause()
    with worker_thread(queues=["default"], name="dash-worker"):
        wait_until(lambda: all(j.refresh().is_finished for j in [*done, failed]),
                   message="jobs to finish")
        page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert 'id="queue-default"' in page
    assert 'id="queue-other"' in page
    default = page[page.index('id="queue-default"'):page.index('id="queue-other"')]
    assert 'data-status="completed"><a' in default
    assert f'status=completed">{3}</a>' in default
    assert 'status=failed">1</a>' in default
    assert 'status=scheduled">1</a>' in default
    assert "running" in default
    assert 'data-field="completed_last_hour">3</span> completed' in default
    assert 'data-field="failed_last_hour">1</span> failed' in default
    # Throughput: bars for the minutes that finished jobs, titled with their figures.
    assert 'class="dq-ok"' in default
    assert "completed, 1 failed</title>" in default
    # Start lateness: 6 starts (3 jobs, and 3 attempts of the failing one).
    assert 'aria-label="Start lateness of 6 starts' in default
    assert 'class="dq-late"' in default
    other = page[page.index('id="queue-other"'):]
    assert "dq-paused" in other
    assert "dq-resume" in other
    assert f"{Queue('other').next_due():%m-%d %H:%M:%S}" in other
    assert "dash-worker" in page
    assert "s ago" in page


def test_pause_resume_and_purge_with_confirmation(admin_client):
    jobs = [tasks.record.using(delay=3600).enqueue(f"p{i}") for i in range(3)]
    response = admin_client.post(control("default", "pause"), follow=True)
    assert Queue("default").is_paused
    assert "Queue default paused" in response.content.decode()
    admin_client.post(control("default", "resume"))
    assert not Queue("default").is_paused
    confirm = admin_client.get(control("default", "purge"))
    assert confirm.status_code == 200
    assert "3 scheduled" in confirm.content.decode()
    assert "Yes, purge default" in confirm.content.decode()
    unconfirmed = admin_client.post(control("default", "purge"))
    assert unconfirmed["Location"] == control("default", "purge")
    assert Queue("default").counts()["scheduled"] == 3
    response = admin_client.post(control("default", "purge"), {"confirm": "yes"}, follow=True)
    assert "3 job(s) deleted" in response.content.decode()
    assert Queue("default").counts()["scheduled"] == 0
    with pytest.raises(Exception, match="no job"):
        jobs[0].refresh()


def test_purge_can_forget_a_queue(admin_client):
    """A queue named by hand (no declared queue, no registered task) is forgotten once
    empty: the dashboard and Queue.all() stop listing it; an enqueue makes it known again."""
    tasks.record.using(queue="adhoc", delay=3600).enqueue("x")
    assert "adhoc" in [q.name for q in Queue.all()]
    response = admin_client.post(control("adhoc", "purge"), {"confirm": "yes", "forget": "yes"},
                                 follow=True)
    assert "Queue adhoc purged and forgotten: 1 job(s) deleted" in response.content.decode()
    assert "adhoc" not in [q.name for q in Queue.all()]
    assert 'id="queue-adhoc"' not in admin_client.get(reverse(DASHBOARD)).content.decode()
    assert admin_client.post(control("adhoc", "pause")).status_code == 404
    # A queue still holding a running job is kept.
    job = tasks.record.using(queue="busy").enqueue("y")
    Queue("busy").broker.claim("busy", 1, "w-1")
    assert EngineJob.fetch(job.id, "busy").status in ("claimed", "active")
    assert Queue("busy").purge(forget=True) == 0
    assert Queue.seen("busy")
    assert Queue("busy").forget() is False


def test_the_dashboard_pages_5000_queues_in_the_round_trips_of_a_few(admin_client):
    tasks.record.enqueue("x")
    tasks.record.using(queue="lonely").enqueue("y")
    broker = Queue("default").broker
    with worker_thread(queues=["default"]):
        admin_client.get(reverse(DASHBOARD))  # the clock read, sessions warmed
        with round_trips() as few:
            page = admin_client.get(reverse(DASHBOARD)).content.decode()
        lonely = page[page.index('id="queue-lonely"'):]
        assert 'data-unserved="1"' in lonely[:400]
        assert "no worker" in lonely
        assert 'data-unserved="0"' in page[page.index('id="queue-default"'):][:400]
        assert "No live worker serves 1 queue(s) with jobs waiting: lonely" in page
        broker.client.sadd(broker.global_keys.queues, *(f"q{i:04}" for i in range(5_000)))
        with round_trips() as many:
            page = admin_client.get(reverse(DASHBOARD)).content.decode()
        assert page.count('<tr id="queue-') == 100
        assert "page 1 of 51" in page
        assert 'href="?page=2"' in page
        assert 'id="queue-lonely"' in page  # names in order: default, lonely, q0000...
        last = admin_client.get(reverse(DASHBOARD), {"page": "51"}).content.decode()
        assert last.count('<tr id="queue-') == 2
        assert 'id="queue-q4999"' in last
        data = admin_client.get(reverse("admin:django_delayq_queues_data"), {"page": "1"})
        assert {q["name"]: q["unserved"] for q in data.json()["queues"]}["lonely"] is True
    assert len(few) <= len(many) <= len(few) + 1, (few, many)


def test_unknown_queue_and_operation_are_404(admin_client):
    tasks.record.enqueue("x")
    assert admin_client.post(control("nope", "pause")).status_code == 404
    assert admin_client.post(control("default", "explode")).status_code == 404
    assert admin_client.get(control("default", "pause")).status_code == 405


# -- escaping -------------------------------------------------------------------------------

def test_user_data_is_escaped_everywhere(admin_client, redis_client):
    job = tasks.record.using(delay=3600).enqueue(XSS, extra={XSS: XSS})
    key = QueueKeys("dq", "default").job(job.id)
    damage = {"error": XSS, "traceback": f"Traceback\n{XSS}", "result": f'"{XSS}"', "worker": XSS}
    redis_client.hset(key, mapping={stored(name): value for name, value in damage.items()})
    mirror()
    gk = GlobalKeys("dq")
    seconds, micros = redis_client.time()
    redis_client.zadd(gk.workers, {XSS: seconds * 1000 + micros // 1000})  # alive now
    redis_client.hset(gk.worker(XSS), mapping={"name": XSS, "host": XSS, "queues": XSS})
    pages = [admin_client.get(reverse(CHANGELIST)).content.decode(),
             admin_client.get(reverse(CHANGELIST), {"q": XSS}).content.decode(),
             admin_client.get(change_url(job.id)).content.decode(),
             admin_client.get(reverse(DASHBOARD)).content.decode()]
    for page in pages:
        assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[2]
    assert pages[2].count("&lt;script&gt;") >= 5
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[3]
