"""The example project's main job: enqueue real-looking jobs, run a worker, show results.

Run it with ``make demo``. It uses ``REDIS_URL`` when set, otherwise starts a throwaway
Redis; it migrates the example project's SQLite database, enqueues jobs (immediate,
delayed a few seconds, one with a high priority, one that fails and is retried), runs
``manage.py runworker`` until every job is finished, and prints what happened.

With ``--serve`` (``make serve``) it then leaves that Redis, a worker and ``runserver``
running until Ctrl-C, so the admin it points to shows the demo's jobs.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    serve_after = "--serve" in sys.argv[1:]
    server = None
    if not os.environ.get("REDIS_URL"):
        from django_delayq.testing import RedisServer

        server = RedisServer().start()
        os.environ["REDIS_URL"] = server.url
        print(f"Started a throwaway Redis at {server.url}")
    try:
        status = run_demo(serve_after)
        if serve_after and status == 0:
            serve(os.environ.get("DEMO_PORT", "8000"))
        return status
    finally:
        if server is not None:
            server.cleanup()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def serve(port: str) -> None:
    """A worker and ``runserver`` on the demo's Redis, until Ctrl-C (or SIGTERM).

    ``runserver --insecure`` serves the static files (the admin's styles, the API's
    Swagger UI and ReDoc) with ``DEBUG`` off, so Django's debug page, which would show
    the settings, stays off too.
    """
    procs = [
        subprocess.Popen([sys.executable, "manage.py", "runworker", "--concurrency", "2"],
                         cwd=HERE, env=dict(os.environ)),
        subprocess.Popen([sys.executable, "manage.py", "runserver", "--noreload", "--insecure",
                          f"127.0.0.1:{port}"], cwd=HERE, env=dict(os.environ)),
    ]
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"\nServing: http://127.0.0.1:{port}/admin/ (admin / admin), the dashboard at "
          f"http://127.0.0.1:{port}/admin/django_delayq/job/queues/, the API at "
          f"http://127.0.0.1:{port}/api/delayq/ (Redis at {os.environ['REDIS_URL']}). "
          "Ctrl-C stops the worker, the server and the demo's Redis.", flush=True)
    try:
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_demo(serving: bool = False) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from shop import tasks

    from django_delayq import Job, Queue, registry

    call_command("migrate", verbosity=0)
    from django_delayq.models import Job as JobRow

    for name in registry.queues():  # start from a clean slate: no jobs of earlier runs
        Queue(name).purge()
    JobRow.objects.all().delete()

    from django_delayq.connection import get_broker

    print("Starting: manage.py runworker --concurrency 2")
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--concurrency", "2"], cwd=HERE,
        env=dict(os.environ),
    )
    broker = get_broker()
    deadline = time.monotonic() + 60
    while not broker.client.zcard(broker.global_keys.workers):
        if worker.poll() is not None or time.monotonic() > deadline:
            print("The worker did not start.")
            return 1
        time.sleep(0.05)

    payments = Queue("payments")
    payments.pause()  # hold the charges so the priority decides their order on resume
    now = dt.datetime.now(dt.UTC)
    jobs: list[tuple[str, Job]] = [
        ("receipt, default delay of 2 s", tasks.send_receipt.enqueue(1001)),
        ("gift receipt, delayed 4 s", tasks.send_receipt.using(delay=4).enqueue(
            1002, template="gift")),
        ("card charge, priority 0", tasks.charge_card.enqueue(1001, Decimal("49.90"))),
        ("card charge, priority 0", tasks.charge_card.enqueue(1002, Decimal("15.00"))),
        ("big order, priority 50", tasks.charge_card.using(priority=50).enqueue(
            1003, Decimal("1200.00"))),
        ("warehouse sync, fails once", tasks.sync_inventory.enqueue("SKU-42")),
        ("report at now + 3 s", tasks.nightly_report.using(
            run_at=now + dt.timedelta(seconds=3)).enqueue("2026-11-20")),
    ]
    again = tasks.send_receipt.using(job_id=f"receipt-{jobs[0][1].id}").enqueue(1001)
    duplicate = tasks.send_receipt.using(job_id=again.id).enqueue(1001)
    jobs.append(("receipt with a job id", again))
    print(f"Enqueued {len(jobs)} jobs; an enqueue with an existing job id was "
          f"{'refused' if not duplicate.created else 'accepted (bug!)'} as a duplicate.")
    print("The payments queue was paused while its three charges were enqueued; "
          "resuming it now.\n")
    payments.resume()
    try:
        while time.monotonic() < deadline:
            if all(job.refresh().is_finished for _, job in jobs):
                break
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    print(f"\nWorker stopped with exit code {code} after SIGTERM.\n")
    status = report(jobs)
    show_admin(serving)
    return status


def show_admin(serving: bool = False) -> None:
    """Make sure the admin user exists and tell how to open the admin."""
    from django.contrib.auth import get_user_model

    from django_delayq.models import Job as JobRow

    print(f"\nThe worker's mirror wrote {JobRow.objects.count()} job rows to the database.")
    users = get_user_model().objects
    if not users.filter(username="admin").exists():
        users.create_superuser("admin", "admin@example.com", "admin")
        print("Created the admin user: username 'admin', password 'admin'.")
    else:
        print("The admin user exists already (username 'admin').")
    if serving:
        return
    print("Open the admin: make serve (or cd example_project && ../.venv/bin/python "
          "manage.py runserver --insecure with REDIS_URL set to a Redis that outlives the "
          "demo), "
          "then http://127.0.0.1:8000/admin/ (the queues dashboard reads the Redis at "
          "REDIS_URL, default redis://127.0.0.1:6379/0).")


def report(jobs: list) -> int:
    header = (f"{'job':<30} {'queue':<9} {'prio':>4} {'status':<10} {'tries':>5} "
              f"{'due in':>7} {'late':>7} {'took':>7}  result")
    print(header)
    print("-" * len(header))
    ok = True
    for label, job in sorted(jobs, key=lambda item: item[1].started_at or item[1].enqueued_at):
        due_in = (job.run_at - job.enqueued_at).total_seconds() if job.run_at else 0.0
        late = ((job.started_at - job.run_at).total_seconds() * 1000
                if job.started_at and job.run_at else float("nan"))
        took = ((job.finished_at - job.started_at).total_seconds() * 1000
                if job.finished_at and job.started_at else float("nan"))
        outcome = job.result if job.status == "completed" else job.error
        ok = ok and job.status == "completed"
        print(f"{label:<30} {job.queue:<9} {job.priority:>4} {job.status:<10} "
              f"{job.attempts:>5} {due_in:>6.1f}s {late:>5.0f}ms {took:>5.0f}ms  {outcome}")
    print("\n'late' is the start time minus the time the job was due, both on the Redis "
          "clock;\nthe retried job's 'late' counts from its retry time.")
    print("All jobs completed." if ok else "Some jobs did not complete.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
