"""Workflows (depends_on, chain, group with a callback) with real worker processes."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from django.urls import reverse

from django_delayq import Job, Queue, chain, group
from django_delayq.mirror import Mirror
from django_delayq.models import Job as JobRow
from django_delayq.worker import Worker
from tests.conftest import ROOT, kill_with_children, ran, wait_until, worker_env, worker_thread
from tests.test_metrics import scrape, value
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def status(job: Job) -> str:
    return Job.fetch(job.id, job.queue).status


def notes(client: Any, task: str) -> list[dict[str, Any]]:
    return [n for n in ran(client) if n["task"] == task]


def await_other_outbox_emptied(client: Any) -> None:
    """Queue ``other``'s releases delivered: the acker releases a dependant, then removes
    its outbox entry in a later round trip."""
    outbox = Queue("other").broker.keys_for("other", "").flow_outbox
    wait_until(lambda: client.llen(outbox) == 0, message="the outbox emptied")


# -- depends_on: checks, already-finished parents, policies, cancellation ------------------


def test_unknown_parent_is_refused_before_anything_is_written(redis_client):
    parent = tasks.record.using(delay=600).enqueue("p")
    keys_before = set(redis_client.keys("*"))
    with pytest.raises(ValueError, match="no job 'nope' in queue 'default'"):
        tasks.record.using(depends_on=[parent, "nope"]).enqueue("child")
    with pytest.raises(ValueError, match=r"names job .* twice"):
        tasks.record.using(depends_on=[parent, parent.id]).enqueue("child")
    with pytest.raises(ValueError, match="on_parent_failure must be one of"):
        tasks.record.using(depends_on=[parent], on_parent_failure="retry")
    with pytest.raises(TypeError, match="depends_on"):
        tasks.record.using(depends_on=[3]).enqueue("child")
    assert set(redis_client.keys("*")) == keys_before


def test_a_child_waits_and_is_shown_waiting_everywhere(broker):
    parent = tasks.record.using(delay=600).enqueue("p")
    child = tasks.record.using(depends_on=[parent]).enqueue("c")
    assert child.status == "waiting"
    live = Job.fetch(child.id)
    assert live.status == "waiting"
    assert live.parent_refs == [("default", parent.id)]
    assert [j.id for j in live.parents] == [parent.id]
    assert [j.id for j in Job.fetch(parent.id).children] == [child.id]
    assert Queue("default").counts()["waiting"] == 1
    assert [j.id for j in Queue("default").jobs("waiting")] == [child.id]


def test_parents_that_already_finished_are_resolved_at_enqueue(broker):
    done = tasks.record.enqueue("done")
    failed = tasks.raises.enqueue("boom")
    Worker(queues=["default"], burst=True).run()
    assert status(done) == "completed"
    assert status(failed) == "failed"
    after_done = tasks.record.using(depends_on=[done]).enqueue("a")
    assert after_done.status == "ready"
    assert status(after_done) == "ready"
    cancelled = tasks.record.using(depends_on=[failed]).enqueue("b")
    assert status(cancelled) == "cancelled"
    assert "parent " + failed.id + " failed" in Job.fetch(cancelled.id).error
    runs = tasks.record.using(depends_on=[done, failed], on_parent_failure="run").enqueue("c")
    assert status(runs) == "ready"
    fails = tasks.record.using(depends_on=[failed], on_parent_failure="fail").enqueue("d")
    assert status(fails) == "failed"


def test_each_failure_policy_and_the_cascade_to_grandchildren(spawned, redis_client):
    parent = tasks.raises.using(delay=0.3).enqueue("boom")
    cancel = tasks.record.using(depends_on=[parent]).enqueue("cancel")
    grandchild = tasks.record.using(depends_on=[cancel], on_parent_failure="run").enqueue("gc")
    run = tasks.flow_collect.using(depends_on=[parent], on_parent_failure="run",
                                   pass_results="all").enqueue("run")
    fail = tasks.record.using(depends_on=[parent], on_parent_failure="fail").enqueue("fail")
    for _ in range(2):  # two worker processes: releases race between them
        spawned("default", "-c", "2")
    wait_until(lambda: status(run) == "completed" and status(fail) == "failed"
               and status(cancel) == "cancelled", message="the policies applied")
    wait_until(lambda: status(grandchild) == "completed", message="grandchild ran")
    (collected,) = notes(redis_client, "flow_collect")
    assert collected["n"] == 1
    assert collected["nones"] == 1
    assert [n["tag"] for n in notes(redis_client, "record")] == ["gc"]
    assert "DependencyFailed" in Job.fetch(fail.id).error


@pytest.mark.parametrize("ends", ["cancelled", "failed"])
def test_dependants_are_told_before_their_finished_parent_is_trimmed(spawned, redis_client,
                                                                     settings, ends):
    """With KEEP_COMPLETED and KEEP_FAILED at 0 a job that ends is trimmed at once, its
    set of dependants with it. Its dependants are told first, and theirs when their
    policy ends them in turn, so none of them waits for ever."""
    from django_delayq import connection

    keep = {"KEEP_COMPLETED": 0, "KEEP_FAILED": 0}
    settings.DELAYQ = {**settings.DELAYQ, **keep}
    connection.reset()
    try:
        parent = (tasks.record.using(delay=600).enqueue("p") if ends == "cancelled"
                  else tasks.raises.using(delay=0.3).enqueue("p"))
        child = tasks.record.using(depends_on=[parent]).enqueue("child")
        tasks.record.using(depends_on=[child], on_parent_failure="run").enqueue("gc")
        if ends == "cancelled":
            assert Job.fetch(parent.id).cancel()
        spawned("default", "-c", "2", "--no-mirror",
                env={"DELAYQ_TEST_SETTINGS": json.dumps(keep)})
        wait_until(lambda: [n["tag"] for n in notes(redis_client, "record")] == ["gc"],
                   message="the grandchild to run")
        wait_until(lambda: Queue("default").counts()["active"] == 0,
                   message="the grandchild's ack")
        assert Queue("default").counts()["waiting"] == 0
        assert Queue("default").counts()[ends] == 0, "trimmed at once"
    finally:
        connection.reset()


def test_cancelling_a_parent_cancels_what_waits_on_it_under_the_default_policy(broker):
    parent = tasks.record.using(delay=600).enqueue("p")
    default = tasks.record.using(depends_on=[parent]).enqueue("c1")
    deeper = tasks.record.using(depends_on=[default]).enqueue("c2")
    runs = tasks.record.using(depends_on=[parent], on_parent_failure="run").enqueue("c3")
    other_queue = tasks.record_other.using(depends_on=[parent]).enqueue("c4")
    assert Job.fetch(parent.id).cancel()
    assert status(default) == status(deeper) == status(other_queue) == "cancelled"
    assert status(runs) == "ready"
    # a waiting job can be cancelled itself; its parent's end then changes nothing
    parent2 = tasks.record.using(delay=600).enqueue("p2")
    child2 = tasks.record.using(depends_on=[parent2]).enqueue("c5")
    assert Job.fetch(child2.id).cancel()
    assert status(child2) == "cancelled"
    assert Queue("default").counts()["waiting"] == 0


def test_a_retried_parent_keeps_its_new_dependants_for_as_long_as_itself(broker):
    """A parent that ended keeps its set of dependants only as long as its own record.
    Retried, the record lives on, and so must the set: the dependants linked to it
    after the retry wait on it, however long it takes to run."""
    parent = tasks.record.using(delay=600).enqueue("p")
    first = tasks.record.using(depends_on=[parent]).enqueue("c1")
    assert Job.fetch(parent.id).cancel()
    assert status(first) == "cancelled"
    job_key = broker.keys_for("default", parent.id).job(parent.id)
    assert broker.client.pttl(job_key + ":c") > 0  # kept as long as the ended parent
    Job.fetch(parent.id).retry(delay=600)
    second = tasks.record.using(depends_on=[parent]).enqueue("c2")
    assert status(second) == "waiting"
    assert broker.client.pttl(job_key) == -1
    assert broker.client.pttl(job_key + ":c") == -1
    Job.fetch(parent.id).reschedule(delay=0)
    Worker(queues=["default"], burst=True).run()
    assert status(second) == "completed"


def test_purging_a_queue_tells_the_dependants_in_other_queues_at_once(broker):
    """A purged parent is 'missing' to its dependants; those in another queue are told
    by the purge, not by a heartbeat of a worker of the purged queue (it may have
    none)."""
    parent = tasks.record.using(delay=600).enqueue("p")
    cancels = tasks.record_other.using(depends_on=[parent]).enqueue("c")
    runs = tasks.record_other.using(depends_on=[parent], on_parent_failure="run").enqueue("r")
    assert Queue("default").purge() == 1
    assert (status(cancels), status(runs)) == ("cancelled", "ready")
    assert Queue("other").counts()["waiting"] == 0


def test_a_child_never_starts_before_its_delayed_parents_run_at(spawned, redis_client):
    now = dt.datetime.now(dt.UTC)
    slow = tasks.flow_step.using(run_at=now + dt.timedelta(seconds=1.5)).enqueue(10, tag="p1")
    fast = tasks.flow_step.enqueue(20, tag="p2")
    # the child's own run_at is earlier than its parent's: the later one wins
    child = tasks.flow_collect.using(depends_on=[slow, fast], pass_results="all",
                                     run_at=now + dt.timedelta(seconds=0.5)).enqueue("c")
    spawned("default", "-c", "4")
    wait_until(lambda: status(child) == "completed", message="the child ran")
    by_tag = {n["tag"]: n for n in ran(redis_client)}
    slow_run_at = int(Job.fetch(slow.id).run_at.timestamp() * 1000)
    assert by_tag["c"]["redis_ms"] >= by_tag["p1"]["redis_ms"] >= slow_run_at
    assert by_tag["c"]["head"] == [11, 21]  # both results, in the parents' order


def test_a_steps_start_lateness_counts_from_its_release_not_its_enqueue(
        spawned, client, admin_client):
    _, out = spawned("default", "-c", "2")
    out.wait_for("worker started", timeout=60)  # the parent starts on time too
    parent, child = chain(tasks.sleeps.bind(5), tasks.take_anything.bind()).enqueue()
    wait_until(lambda: status(child) == "completed", timeout=60, message="the chain ran")
    live = Job.fetch(child.id)
    # counted from its enqueue it would be 5 s or more: the bound leaves a busy machine
    # room for the fetcher to wake and hand the child over
    assert live.started_at - live.run_at < dt.timedelta(seconds=2)
    assert live.run_at >= Job.fetch(parent.id).finished_at - dt.timedelta(milliseconds=1)
    Mirror(block=0.1).run(burst=True)
    row = JobRow.objects.get(job_id=child.id)
    assert row.lateness is not None
    assert 0 <= row.lateness < 2
    page = admin_client.get(reverse("admin:django_delayq_job_change", args=[row.pk]))
    assert f"{row.lateness:.3f} s" in page.content.decode()
    m = scrape(client)
    d = {"queue": "default"}
    # both starts, the parent's and the child's, within the 100 ms bucket
    assert value(m, "delayq_job_start_lateness_seconds_count", **d) == 2
    assert value(m, "delayq_job_start_lateness_seconds_bucket", le="0.1", **d) == 2


# -- chains, groups, diamonds -----------------------------------------------------------


def test_a_chain_of_100_steps_passes_each_result_on(spawned, redis_client):
    jobs = chain(tasks.flow_step.bind(0),
                 *[tasks.flow_step.bind(tag=f"s{i}") for i in range(1, 100)],
                 pass_results=True).enqueue()
    assert [j.status for j in jobs[:2]] == ["ready", "waiting"]
    spawned("default", "-c", "4")
    spawned("default", "-c", "4")
    wait_until(lambda: status(jobs[-1]) == "completed", timeout=60, message="the chain ended")
    steps = notes(redis_client, "flow_step")
    assert [n["acc"] for n in steps] == list(range(100))  # in order, each once
    assert Job.fetch(jobs[-1].id).result == 100


def test_a_burst_worker_finishes_the_cross_queue_chains_its_queues_hold(redis_client):
    """Each step of these chains lands in another queue, released by the step before
    (through the cross-slot outbox), and in another lane of the worker (an async def
    step on the event loop, a plain one on a thread): ``runworker --burst`` serving the
    queues exits 0 only once every step ran."""
    steps = [tasks.flow_step, tasks.flow_step.using(queue="other"), tasks.async_flow_step]
    chains = [chain(*[steps[i % 3].bind(*(() if i else (0,)), tag=f"c{c}s{i}")
                      for i in range(8)], pass_results=True).enqueue() for c in range(5)]
    assert {j.queue for j in chains[0]} == {"default", "other", "async"}
    done = subprocess.run([sys.executable, "-m", "django", "runworker", "default", "other",
                           "async", "--burst", "-c", "2"], cwd=ROOT, env=worker_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [status(steps[-1]) for steps in chains] == ["completed"] * 5, done.stderr
    assert [Job.fetch(steps[-1].id, steps[-1].queue).result for steps in chains] == [8] * 5
    assert len(notes(redis_client, "flow_step")) == 40


@pytest.mark.slow
def test_a_group_of_10000_members_calls_its_callback_exactly_once(spawned, redis_client):
    n = 10_000
    jobs = group(tasks.flow_member.bind(i) for i in range(n)).then(
        tasks.flow_collect.bind("cb")).enqueue()
    assert len(jobs.members) == n
    assert jobs.callback is not None
    assert jobs.callback.status == "waiting"
    for _ in range(2):
        spawned("default", "-c", "8", "--prefetch", "64")
    wait_until(lambda: status(jobs.callback) == "completed", timeout=120, interval=0.2,
               message="the callback ran")
    counts = redis_client.hgetall("test:members")
    assert len(counts) == n
    assert set(counts.values()) == {"1"}
    (collected,) = notes(redis_client, "flow_collect")
    assert collected["n"] == n
    assert collected["total"] == sum(2 * i for i in range(n))
    assert collected["head"] == [0, 2, 4]


def test_a_diamond_runs_its_last_job_once_with_both_results(spawned, redis_client):
    top = tasks.flow_step.using(delay=0.3).enqueue(0, tag="top")
    left = tasks.flow_step.using(depends_on=[top], pass_results="one").enqueue(tag="left")
    right = tasks.flow_step.using(depends_on=[top], pass_results="one").enqueue(tag="right")
    bottom = tasks.flow_collect.using(depends_on=[left, right],
                                      pass_results="all").enqueue("bottom")
    for _ in range(2):  # two worker processes: left and right may end at once
        spawned("default", "-c", "2")
    wait_until(lambda: status(bottom) == "completed", message="the diamond ended")
    (collected,) = notes(redis_client, "flow_collect")
    assert collected["head"] == [2, 2]
    assert sorted(n["tag"] for n in notes(redis_client, "flow_step")) == ["left", "right", "top"]


def test_a_dependency_across_two_queues(spawned, redis_client):
    parent = tasks.record_other.using(delay=0.3).enqueue("p")
    child = tasks.flow_collect.using(depends_on=[parent], pass_results="all").enqueue("c")
    spawned("default", "-c", "2")
    spawned("other", "-c", "2")
    wait_until(lambda: status(child) == "completed", message="the child in default ran")
    (collected,) = notes(redis_client, "flow_collect")
    assert collected["head"] == ["p"]
    await_other_outbox_emptied(redis_client)


# -- crash points of a release across shards ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("step", ["deliver:read", "deliver:resolved", "deliver:removed"])
def test_a_worker_killed_at_each_step_of_a_release_loses_and_doubles_nothing(
        spawned, redis_client, step):
    """Members in queue ``other`` (another shard), the callback in ``default``: the
    worker acking the last member exits at ``step`` of the delivery; another worker's
    heartbeat delivers what is left."""
    members = [tasks.record_other.bind(f"m{i}") for i in range(20)]
    jobs = group(members).then(tasks.flow_collect.bind("cb")).enqueue()
    child = tasks.record.using(depends_on=[jobs.members[0]], pass_results="one").enqueue()
    crashing, out = spawned("other", "-c", "1", "--lease", "1", "--prefetch", "1",
                            env={"DELAYQ_TEST_CRASH_AT": step})  # tests/testapp/flow_hooks.py
    out.wait_for("worker-0 died pid=", timeout=30)
    kill_with_children(crashing)  # and its host, before it starts another worker process
    spawned("other", "default", "-c", "2", "--lease", "1")
    wait_until(lambda: status(jobs.callback) == "completed" and status(child) == "completed",
               message="both dependants released")
    (collected,) = notes(redis_client, "flow_collect")
    assert collected["n"] == 20
    assert collected["head"] == ["m0", "m1", "m2"]
    assert [n["tag"] for n in notes(redis_client, "record")] == ["m0"]  # once, with m0's result
    await_other_outbox_emptied(redis_client)


# -- crash points of an enqueue: a producer killed between storing and linking ----------


def stopped_producer(job_id: str, parents: list[tuple[str, str]]) -> None:
    """Run ``tests/stop_before_link.py`` until it stops between storing the job and
    linking it, then SIGKILL it there."""
    with subprocess.Popen(
            [sys.executable, "-m", "tests.stop_before_link",
             json.dumps({"job_id": job_id, "parents": parents})],
            cwd=ROOT, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) as proc:  # its output pipe is closed on the way out
        try:
            _, state = os.waitpid(proc.pid, os.WUNTRACED)
            stopped = os.WIFSTOPPED(state)
        finally:
            proc.kill()
            proc.wait()
        assert stopped, proc.stdout.read() if proc.stdout else "the producer did not stop"


def test_a_producer_killed_between_storing_and_linking_strands_nothing(spawned, redis_client,
                                                                      broker):
    """The dependant's parent in its own shard is linked by the enqueue script itself;
    those in another shard are linked again by a worker's heartbeat, one lease later:
    one that had finished resolves it at once, one still pending when it ends."""
    done = tasks.record_other.enqueue("done")
    late = tasks.record_other.using(delay=600).enqueue("late")
    Worker(queues=["other"], burst=True).run()
    local = tasks.flow_step.using(delay=0.5).enqueue(1, tag="local")
    stopped_producer("stranded", [("other", done.id), ("default", local.id),
                                  ("other", late.id)])
    keys, other = broker.keys_for("default", "stranded"), broker.keys_for("other", late.id)
    assert status(Job.fetch("stranded")) == "waiting"
    assert redis_client.smembers(keys.job(local.id) + ":c") == {"L 2 stranded"}
    assert not redis_client.exists(other.job(done.id) + ":c", other.job(late.id) + ":c")
    assert redis_client.zrange(keys.flow_linking, 0, -1) == ["stranded"]
    spawned("default", "other", "-c", "2", "--lease", "1")
    wait_until(lambda: redis_client.smembers(other.job(late.id) + ":c") == {
        "R 3 default - stranded"} and not redis_client.zcard(keys.flow_linking),
        timeout=30, message="the heartbeat linked the dependant to its pending parent")
    assert status(Job.fetch("stranded")) == "waiting"
    Job.fetch(late.id, "other").reschedule(delay=0)
    wait_until(lambda: status(Job.fetch("stranded")) == "completed", timeout=30,
               message="the stranded dependant ran")
    (collected,) = notes(redis_client, "flow_collect")
    assert collected["head"] == ["done", 2, "late"]


def test_enqueuing_a_stranded_dependant_again_links_it(broker, redis_client):
    parent = tasks.record_other.enqueue("p")
    stopped_producer("again", [("other", parent.id)])
    parent_keys = broker.keys_for("other", parent.id)
    assert not redis_client.exists(parent_keys.job(parent.id) + ":c")
    again = tasks.flow_collect.using(job_id="again", pass_results="all",
                                     depends_on=[("other", parent.id)]).enqueue("c")
    assert (again.created, again.status) == (False, "waiting")
    assert redis_client.smembers(parent_keys.job(parent.id) + ":c") == {
        "R 1 default - again"}
    assert redis_client.zcard(broker.keys_for("default", "again").flow_linking) == 0
    Worker(queues=["other"], burst=True).run()
    assert status(again) == "ready"
    Worker(queues=["default"], burst=True).run()
    assert Job.fetch("again").result == 1
    (collected,) = notes(redis_client, "flow_collect")
    assert collected["head"] == ["p"]


def test_enqueue_many_takes_dependencies_one_round_trip_per_chunk(broker):
    from django_delayq.engine import EnqueueRequest

    requests = [EnqueueRequest(task=tasks.record.name, args=[f"r{i}"], job_id=f"r{i}")
                for i in range(5)]
    requests.append(EnqueueRequest(task=tasks.flow_collect.name, args=["cb"], job_id="cb",
                                   depends_on=[f"r{i}" for i in range(5)],
                                   pass_results="all"))
    total = broker.enqueue_many("default", requests)
    assert total.enqueued == 6
    assert total.chunks == 1
    assert Job.fetch("cb").status == "waiting"
    assert json.loads(broker.client.hget(broker.keys_for("default", "cb").job("cb"), "d")) == [
        ["default", f"r{i}"] for i in range(5)]


# -- the Django layer: mirror, admin, API, Tasks backend, eager mode ---------------------


def test_waiting_jobs_in_the_mirror_admin_and_api(admin_client, redis_client):
    from django_delayq.mirror import Mirror
    from django_delayq.models import Job as Row

    parent = tasks.record.using(delay=600).enqueue("p")
    child = tasks.record_other.using(depends_on=[parent]).enqueue("c")
    Mirror(block=0.1).run(burst=True)
    row = Row.objects.get(job_id=child.id)
    assert row.status == "waiting"
    assert row.parents == [["default", parent.id]]
    assert Row.objects.filter(status="waiting").count() == 1  # the admin's status filter
    parent_row = Row.objects.get(job_id=parent.id)
    page = admin_client.get(f"/admin/django_delayq/job/{parent_row.pk}/change/").content
    assert b"dq-workflow" in page
    assert b"<strong>Then</strong>" in page
    assert child.id.encode() in page
    assert b"dq-status-waiting" in page  # the dependant's live status
    detail = admin_client.get(f"/api/delayq/jobs/other/{child.id}/").json()
    assert detail["live"]["status"] == "waiting"
    assert detail["workflow"]["parents"] == [{"queue": "default", "job_id": parent.id,
                                             "task": tasks.record.name,
                                             "status": "scheduled", "parents": [],
                                             "more": 0}]
    counts = admin_client.get("/api/delayq/queues/").json()["results"]
    assert {q["name"]: q["counts"]["waiting"] for q in counts}["other"] == 1
    cancelled = admin_client.post(f"/api/delayq/jobs/other/{child.id}/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"


def test_the_tasks_backend_reports_a_waiting_job_ready():
    from django_delayq.backends import STATUS_MAP, TaskResultStatus

    assert STATUS_MAP["waiting"] == TaskResultStatus.READY


def test_chains_and_groups_run_in_order_in_eager_mode(settings):
    settings.DELAYQ = {**settings.DELAYQ, "EAGER": True}
    jobs = chain(tasks.flow_step.bind(1), tasks.flow_step.bind(), pass_results=True).enqueue()
    assert [j.result for j in jobs] == [2, 3]
    done = group([tasks.flow_member.bind(1), tasks.flow_member.bind(2)]).then(
        tasks.flow_collect.bind("eager")).enqueue()
    assert done.callback is not None
    assert done.callback.result == 2
    failing = chain(tasks.raises.bind("boom"), tasks.record.bind("never")).enqueue()
    assert [j.status for j in failing] == ["failed", "cancelled"]


def test_an_unreadable_outbox_entry_is_dropped_and_the_others_delivered(broker, redis_client):
    parent = tasks.record_other.using(delay=600).enqueue("p")
    child = tasks.record.using(depends_on=[parent], on_parent_failure="run").enqueue("c")
    outbox = broker.keys_for("other", parent.id).flow_outbox
    redis_client.rpush(outbox, "not json", '{"m": "R x"}')
    assert Job.fetch(parent.id, "other").cancel()  # delivers its outbox at once
    assert status(child) == "ready"
    assert redis_client.llen(outbox) == 0


# -- the heartbeat's repair: damaged parents, jobs no longer waiting, one report each ----


def damaged_dependant(broker: Any, redis_client: Any, policy: str) -> Job:
    """A waiting job whose stored parent names a queue that cannot exist, left in the
    linking set long ago (as by a producer that died before confirming its links)."""
    parent = tasks.record_other.using(delay=600).enqueue("p")
    child = tasks.record.using(depends_on=[("other", parent.id)],
                               on_parent_failure=policy).enqueue("c")
    keys = broker.keys_for("default", child.id)
    redis_client.hset(keys.job(child.id), "d", json.dumps([["no such queue!", parent.id]]))
    redis_client.zadd(keys.flow_linking, {child.id: 0})
    return child


@pytest.mark.parametrize(("policy", "outcome"), [("cancel", "cancelled"),
                                                 ("run", "completed")])
def test_a_damaged_waiting_job_follows_its_policy_and_the_heartbeat_lives_on(
        broker, redis_client, caplog, policy, outcome):
    child = damaged_dependant(broker, redis_client, policy)
    keys = broker.keys_for("default", child.id)
    workers = broker.global_keys.workers
    with worker_thread(queues=["default"], lease=0.6) as worker:
        wait_until(lambda: status(child) == outcome, message="the damaged job to resolve")
        beat = redis_client.zscore(workers, worker.name)
        wait_until(lambda: (redis_client.zscore(workers, worker.name) or 0) > beat,
                   message="the next heartbeats")
        assert any(t.name == "delayq-heartbeat" for t in threading.enumerate())
    assert not redis_client.zcard(keys.flow_linking)
    job = Job.fetch(child.id)
    if policy == "cancel":
        assert job.error.startswith("DependencyFailed: parent ")
        assert job.error.endswith(" missing")
    else:
        assert job.result == "c"
    damaged = [r for r in caplog.records if "cannot exist" in r.getMessage()]
    assert len(damaged) == 1, [r.getMessage() for r in caplog.records]
    assert "invalid queue name 'no such queue!'" in damaged[0].getMessage()


def test_a_burst_starts_with_a_damaged_waiting_job(broker, redis_client):
    child = damaged_dependant(broker, redis_client, "cancel")
    assert Worker(queues=["default"], burst=True).run() == 0
    assert status(child) == "cancelled"


def test_a_stranded_dependant_goes_to_one_heartbeat_per_grace_period(broker, redis_client):
    """Every worker serving the queue reclaims; the first to take a dependant to link
    again has it to itself until the grace period has passed again."""
    parent = tasks.record_other.using(delay=600).enqueue("p")
    child = tasks.record.using(depends_on=[("other", parent.id)]).enqueue("c")
    keys = broker.keys_for("default", child.id)
    redis_client.zadd(keys.flow_linking, {child.id: 0})

    def handed_over(grace_ms: int) -> list[str]:
        batch = broker.batch()
        broker.add_reclaim(batch, keys, link_grace_ms=grace_ms)
        return batch.run()[0][3]

    assert handed_over(60_000) == [child.id]
    assert handed_over(60_000) == [], "another heartbeat within the grace period"
    assert handed_over(0) == [child.id], "still unconfirmed a grace period later"


def test_the_repair_says_what_it_found(broker, redis_client, caplog):
    from django_delayq.engine import flows

    parent = tasks.record_other.using(delay=600).enqueue("p")
    stranded = tasks.record.using(depends_on=[("other", parent.id)]).enqueue("s")
    cancelled = tasks.record.using(depends_on=[("other", parent.id)]).enqueue("x")
    assert Job.fetch(cancelled.id).cancel()
    keys = broker.keys_for("default", stranded.id)
    caplog.set_level("INFO", logger="django_delayq")
    found = flows.repair(broker, keys, [stranded.id, cancelled.id])
    assert (found.waiting, found.gone, found.damaged) == ([stranded.id], [cancelled.id], [])
    lines = [r.getMessage() for r in caplog.records if r.name == "django_delayq.engine.flows"]
    assert len(lines) == 2, lines
    again, gone = lines
    assert again.startswith("linked waiting jobs to their parents again")
    assert f"ids={stranded.id}" in again
    assert gone.startswith("jobs no longer waiting left the linking set")
    assert f"ids={cancelled.id}" in gone


def test_chains_and_groups_on_a_sharded_queue_return_each_step_as_itself(settings):
    """The shards of a queue answer one call each; the jobs come back in step order."""
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"wide": {"shards": 3}}}
    wide = tasks.record.using(queue="wide")
    steps = chain(*[wide.bind(f"s{i}") for i in range(12)]).enqueue()
    assert [j.status for j in steps] == ["ready"] + ["waiting"] * 11
    for before, step in itertools.pairwise(steps):
        assert Job.fetch(step.id, "wide").parent_refs == [("wide", before.id)]
    members = [wide.using(job_id=f"m{i}").bind(f"m{i}") for i in range(12)]
    jobs = group(members).then(tasks.flow_collect.using(queue="wide").bind(tag="cb")).enqueue()
    assert [j.id for j in jobs.members] == [f"m{i}" for i in range(12)]
    assert jobs.callback.id not in {j.id for j in jobs.members}
    callback = Job.fetch(jobs.callback.id, "wide")
    assert (callback.task_name, callback.status) == (tasks.flow_collect.name, "waiting")
    assert callback.parent_refs == [("wide", f"m{i}") for i in range(12)]
