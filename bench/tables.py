"""Markdown sections for django-delayq's own rows: its ``runworker`` configurations and
replicas (in ``latest.json``), and the results file of each stand-alone script
(``shards.json``, ``workflows.json``, ...), each with the load it ran under.

Standard library only: ``bench.report`` runs under either virtualenv.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Lines = list[str]


def n(value: Any, spec: str = "{:,.0f}") -> str:
    """``value`` formatted, or n/a."""
    return "n/a" if value is None else spec.format(value)


def _load(values: Any) -> str:
    return "/".join(f"{v:.1f}" for v in values) if values else "n/a"


def ran(env: dict[str, Any] | None) -> str:
    """When and under what load a script ran."""
    if not env:
        return ""
    return (f"{env.get('date', '?')} · scale {env.get('scale', '?')} · "
            f"{n(env.get('duration_s'), '{:,.0f}')} s · load average (1/5/15 min) "
            f"{_load(env.get('load_average_start'))} at start, "
            f"{_load(env.get('load_average_end'))} at end")


def _median(values: list[float | None] | None) -> float | None:
    found = sorted(v for v in values or [] if v is not None)
    if not found:
        return None
    mid = len(found) // 2
    return found[mid] if len(found) % 2 else (found[mid - 1] + found[mid]) / 2


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(*titles: str) -> Lines:
    return [_row(*titles), "|---|" + "---:|" * (len(titles) - 1)]


# --- latest.json ------------------------------------------------------------------------


def configurations(data: dict[str, Any], tuned_1proc: float | None) -> Lines:
    """Pool, time limits and the default configuration (``bench.configurations``)."""
    lines = ["## django-delayq's worker configurations", ""]
    if data.get("load_average_start"):
        lines += [f"Time limits and defaults: {n(data.get('duration_s'))} s, load average "
                  f"{_load(data['load_average_start'])} at start, "
                  f"{_load(data['load_average_end'])} at end.", ""]
    pool = data.get("pool")
    if pool:
        lines += [
            f"**Process pool** ({n(pool['n'])} no-op jobs, the 2-process backlog and window "
            "of the table above, measured back to back in each run):", "",
            *_header("workers", "jobs/s (median)", "min", "max", "workers µs/job",
                     "Redis µs/job"),
        ]
        for label, key in (("two separate `runworker` processes", "separate"),
                           ("one `runworker --processes 2`", "pool")):
            s = pool[key]
            cpu = s.get("cpu_us_per_job") or {}
            lines.append(_row(label, n(s["median"]), n(s["min"]), n(s["max"]),
                              n(_median(cpu.get("workers")), "{:,.1f}"),
                              n(_median(cpu.get("redis")), "{:,.1f}")))
        lines += ["", f"Pool / separate: {n(pool['pool_vs_separate'], '{:.2f}')}.", ""]
    limits = data.get("time_limits")
    if limits:
        lines += _paired(
            limits, f"**Time limits** (1 process of 8 threads, {n(limits['n'])} no-op jobs, "
            f"{limits['pairs']} pairs of runs in alternating order):", "worker",
            ("no time limit", "`--timeout 60`"), "With / without")
        lines += _measured_apart(limits)
    supervision = data.get("supervision")
    if supervision:
        lines += _paired(
            supervision, f"**Supervision** (1 process of 8 threads, {n(supervision['n'])} "
            f"no-op jobs, {supervision['pairs']} pairs of runs in alternating order): "
            "`runworker` (a host watching its worker process's deadline board) against the "
            "same worker process started alone, which nothing watches:", "worker",
            ("`runworker` (supervised)", "worker process alone"), "Alone / supervised")
    async_tasks = data.get("async_tasks")
    if async_tasks:
        lines += _paired(
            async_tasks, f"**Async tasks** (1 process, {n(async_tasks['n'])} no-op jobs, "
            f"{async_tasks['pairs']} pairs of runs in alternating order): the no-op task "
            "as a sync function on 8 threads against the same as an `async def` task on the "
            "worker's event loop (`DELAYQ[\"ASYNC_CONCURRENCY\"]` 10):", "task",
            ("`def noop()`, threads", "`async def anoop()`, event loop"), "Async / sync")
    defaults = data.get("defaults")
    if defaults:
        mirror = defaults["mirror"]
        lines += [
            f"**The default configuration**, as a user runs it: `runworker` with nothing set "
            "(the library's threads, the model mirror as `runworker` runs it by default, "
            f"SQLite, a log line per job), {n(defaults['n'])} no-op jobs, {defaults['runs']} "
            "runs each, alternating:", "",
            *_header("worker", "jobs/s (median)", "min", "max",
                     "spread (largest distance from the median)", "each run",
                     "worker µs/job (median)"),
        ]
        for label, s in (("`runworker` (default: with the mirror)", mirror),
                         ("`runworker --no-mirror`", defaults["no_mirror"])):
            cpu = s.get("cpu_us_per_job") or {}
            lines.append(_row(label, n(s["median"]), n(s["min"]), n(s["max"]),
                              n(s["spread"], "{:.1%}"),
                              ", ".join(f"{v:,.0f}" for v in s["per_s"]),
                              n(cpu.get("workers_median"), "{:,.1f}")))
        lines += [
            "",
            f"Default / `--no-mirror`: {n(defaults['mirror_vs_no_mirror'], '{:.2f}')}. The "
            "mirror had every event in the database "
            f"{n(mirror.get('settled_after_last_s_median'), '{:.2f}')} s after the last job "
            "(median); from the first job run to the last one's row, "
            f"{n(mirror.get('drained_to_database_per_s'))} jobs/s. Beside them, the tuned "
            f"worker of the table above (8 threads, `--no-mirror`, `-v 0`): "
            f"{n(tuned_1proc)} jobs/s.", "",
            *_measured_apart(defaults),
        ]
    return lines


def _paired(row: dict[str, Any], title: str, what: str, labels: tuple[str, str],
            ratio: str) -> list[str]:
    """The table of a row measured in alternating pairs (``configurations.paired``): the
    run without the variant ("off") and with it ("on"), then their ratio."""
    lines = [title, "", *_header(what, "jobs/s (median)", "min", "max", "spread")]
    for label, key in zip(labels, ("off", "on"), strict=True):
        s = row[key]
        lines.append(_row(label, n(s["median"]), n(s["min"]), n(s["max"]),
                          n(s["spread"], "{:.1%}")))
    return [*lines, "", f"{ratio}: {n(row['ratio'], '{:.3f}')}.", ""]


def _measured_apart(block: dict[str, Any]) -> Lines:
    """The note of a block measured again apart from the rest of its run (when, the load,
    why), or nothing."""
    measured = block.get("measured")
    if not measured:
        return []
    return [f"This row was measured at {measured['at']} (load average "
            f"{_load(measured.get('load_average_start'))} at start, "
            f"{_load(measured.get('load_average_end'))} at end): {measured['why']}.", ""]


def replication(figures: dict[str, Any]) -> Lines:
    """The ``MIN_REPLICAS`` table (``bench.replicas``): enqueue rates with 0 and 1."""
    rows = [
        "## Durable enqueue (MIN_REPLICAS), django-delayq on a primary with 1 replica",
        "",
        *_header("enqueue", "MIN_REPLICAS=0", "MIN_REPLICAS=1", "1 / 0"),
    ]
    for kind, label in (("single", f"single ({figures['single_n']:,} jobs), jobs/s"),
                        ("bulk", f"bulk ({figures['bulk_n']:,} jobs in chunks of 1,000), "
                                 "jobs/s")):
        rows.append(_row(label, n(figures[f"{kind}_per_s_min_replicas_0"]),
                         n(figures[f"{kind}_per_s_min_replicas_1"]),
                         n(figures[f"{kind}_ratio"], "{:.2f}")))
    return [*rows, "", "With MIN_REPLICAS=1 each call sends `WAIT 1` in the round trip of "
            "its script (a bulk call: once per chunk): it returns once the replica has the "
            "jobs. The two settings are timed in alternating blocks.", ""]


# --- the stand-alone scripts' files -------------------------------------------------------


def shards(data: dict[str, Any]) -> Lines:
    where = ("Redis server, every shard in one process (`python -m bench.shards "
             "--one-server`)" if data.get("benchmark") == "shards_one_server" else
             "3-primary Redis Cluster (`python -m bench.shards`)")
    runs = data["rows"][0].get("runs", 1) if data["rows"] else 1
    baseline = data.get("baseline")
    lines = [f"One queue's backlog of {n(data['jobs'])} no-op jobs drained by "
             f"{data['workers']} `runworker` processes from 1, 2 and 3 shards on a local "
             f"{where}, with the adaptive prefetch and with claims of about 20 jobs "
             f"(prefetch 16); medians of {runs} runs. Per core: jobs a second per core busy "
             "with the queue; bound: the busiest Redis process's one core."
             + (f" Code: this checkout, or the baseline `{baseline}` run right before it."
                if baseline else ""), "",
             *_header("prefetch", "shards", "code", "jobs/s", "Redis µs/job", "per node",
                      "workers µs/job", "script calls / 1,000 jobs", "jobs/s per core",
                      "bound jobs/s", "load")]
    for row in data["rows"]:
        prefetch = row.get("prefetch")
        lines.append(_row("adaptive" if prefetch is None else str(prefetch), str(row["shards"]),
                          row.get("code", "current"), n(row["jobs_per_s"]),
                          n(row["redis_cpu_us_per_job"], "{:,.1f}"),
                          " / ".join(f"{v:.1f}" for v in row["redis_cpu_us_per_job_per_node"]),
                          n(row["workers_cpu_us_per_job"], "{:,.1f}"),
                          n(row.get("script_calls_per_1000_jobs"), "{:,.1f}"),
                          n(row.get("jobs_per_s_per_core")),
                          n(row.get("primaries_bound_jobs_per_s")), _load(row.get("load"))))
    return lines


def workflows(data: dict[str, Any]) -> Lines:
    lines = [f"A group of {n(data['members'])} members and its callback, {data['procs']} "
             f"worker processes of {data['threads']} threads, on one Redis "
             "(`python -m bench.workflows`).", "",
             *_header("library", "enqueue s", "total s",
                      "last member to callback ms", "bytes per member waiting",
                      "bytes per waiting job", "bytes per scheduled job")]
    for row in data["rows"]:
        lines.append(_row(row["lib"], n(row["enqueue_s"], "{:,.2f}"),
                          n(row["total_s"], "{:,.2f}"), n(row["release_ms"], "{:,.1f}"),
                          n(row.get("bytes_per_member_waiting")),
                          n(row.get("bytes_per_waiting")), n(row.get("bytes_per_scheduled"))))
    return lines


def outbox(data: dict[str, Any]) -> Lines:
    back, only = data["redis_back"], data["relay_only"]
    lines = [f"{n(data['transactions'])} transactions of one INSERT and one enqueue each, "
             "PostgreSQL (`python -m bench.outbox`).", "",
             *_header("transaction", "µs/transaction", "per s")]
    lines += [_row(t["label"], n(t["us_per_transaction"]), n(t["per_s"])) for t in data["timed"]]
    relay = data["relay"]
    lines += ["",
              f"The relay sent {n(relay['rows'])} rows in chunks of {relay['chunk']}: "
              f"{n(relay['rows_per_s'])} rows/s. Redis back after {back['down_s']:g} s down "
              f"with {n(back['rows'])} rows waiting: the first job in Redis after "
              f"{n(back['first_ms'])} ms, all after {n(back['all_ms'])} ms. The relay alone "
              f"(polling every {only['poll_interval_s']:g} s), commit to job in Redis over "
              f"{only['samples']} samples: p50 {n(only['p50_ms'])} ms, max "
              f"{n(only['max_ms'])} ms."]
    return lines


def lake(data: dict[str, Any]) -> Lines:
    # results written before bench.lake stored its size at the top name it per part
    jobs = data.get("jobs") or (data.get("export") or data.get("cluster") or {}).get("jobs")
    lines = [f"{n(jobs)} jobs (`python -m bench.lake`).", ""]
    export = data.get("export")
    if export:
        read = export.get("spark_read") or {}
        seconds = n(export["export_seconds"], "{:,.1f}")
        lines += [f"- Export: {n(export['events'])} events in {seconds}"
                  f" s, killed halfway between a file and its acknowledgement then run again: "
                  f"{n(export['events_per_s'])} events/s, "
                  f"{n(export['exporter_cpu_us_per_event'], '{:,.2f}')} µs of exporter CPU per "
                  f"event, {export['files']} file{'' if export['files'] == 1 else 's'}, "
                  f"{n(export['lake_mib'], '{:,.1f}')} MiB "
                  f"(load {_load(export.get('load'))}). Spark (`local[*]`) counts the events "
                  f"in {n(read.get('count_seconds'), '{:,.1f}')} s and the attempts with "
                  f"percentiles in {n(read.get('attempts_with_percentiles_seconds'), '{:,.1f}')}"
                  " s."]
    jdbc = data.get("jdbc_vs_orm")
    if jdbc:
        lines += [f"- The job table of {n(jdbc['rows'])} rows read and counted on "
                  f"`{jdbc['master']}`: ORM (the driver) "
                  f"{n(jdbc['orm']['rows_per_s'])} rows/s, report "
                  f"{n(jdbc['orm']['report_seconds'], '{:,.1f}')} s; JDBC (the executors) "
                  f"{n(jdbc['jdbc']['rows_per_s'])} rows/s, report "
                  f"{n(jdbc['jdbc']['report_seconds'], '{:,.1f}')} s "
                  f"(load {_load(jdbc['orm'].get('load'))}, {_load(jdbc['jdbc'].get('load'))})."]
    cluster = data.get("cluster")
    if cluster:
        for key, label in (("local[*]", "`local[*]`"),
                           ("standalone_2x1", "a standalone cluster (2 workers of 1 core)")):
            c = cluster.get(key)
            if c:
                lines.append(f"- `enqueue_dataframe` on {label}: {n(c['spark']['jobs_per_s'])} "
                             f"jobs/s, re-run (every job a duplicate) "
                             f"{n(c['spark_rerun']['jobs_per_s'])} jobs/s, start-up "
                             f"{n(c['startup_seconds'], '{:,.1f}')} s "
                             f"(load {_load(c.get('load'))}).")
    return lines


def spark_bulk(data: dict[str, Any]) -> Lines:
    return [f"{n(data['jobs'])} delayed jobs with ids, chunks of {data['chunk_size']:,} "
            "(`python -m bench.spark_bulk`).", "",
            *_header("path", "jobs/s", "seconds"),
            _row("`enqueue_many`, one process", n(data["enqueue_many"]["jobs_per_s"]),
                 n(data["enqueue_many"]["seconds"], "{:,.1f}")),
            _row(f"`enqueue_dataframe` on `{data['master']}`", n(data["spark"]["jobs_per_s"]),
                 n(data["spark"]["seconds"], "{:,.1f}")),
            _row("the same again (every job a duplicate)", n(data["spark_rerun"]["jobs_per_s"]),
                 n(data["spark_rerun"]["seconds"], "{:,.1f}")),
            "", f"Spark's start-up, not counted: {n(data['startup_seconds'], '{:,.1f}')} s."]


def bulk_enqueue(data: dict[str, Any]) -> Lines:
    return [f"{n(data['jobs'])} no-op jobs through the engine, chunks of {data['chunk']:,} "
            "(`python -m bench.bulk_enqueue`).", "",
            *_header("path", "jobs/s", "round trips"),
            _row("`enqueue_many`", n(data["enqueue_many"]["jobs_per_s"]),
                 n(data["enqueue_many"]["round_trips"])),
            _row("`enqueue`, one call per job", n(data["enqueue"]["jobs_per_s"]),
                 n(data["enqueue"]["round_trips"])),
            "", f"Speed-up: {data['speed_up']:.1f}x."]


def keyed(data: dict[str, Any]) -> Lines:
    """Per-key flow control (`python -m bench.keyed`)."""
    us = "{:,.2f}"

    def row(label: str, name: str) -> str:
        found = data.get(name) or {}
        return _row(label, n(found.get("per_s")), n(found.get("redis_us_per_job"), us),
                    n(found.get("load"), us))

    lines = [f"{n(data['jobs'])} no-op jobs per row through the engine, one process: claims "
             "and acks of 20; the claim rows alternate, medians of 3 rounds; Redis µs: "
             "script time per job (`INFO commandstats`) (`python -m bench.keyed`).", "",
             *_header("row", "jobs/s", "Redis µs/job", "load"),
             row("claim + ack, no keys", "claim_no_keys"),
             row("claim + ack, 1 key (never at its limit)", "claim_1_key"),
             row("claim + ack, 10,000 keys", "claim_10000_keys"),
             row("claim + ack, 2 keys weighted 3:1", "claim_2_keys_weighted_3_1"),
             row("claim + ack, 1 key limited to 10 (parked, released)",
                 "claim_1_key_limit_10"),
             row("single enqueue, plain", "enqueue_plain"),
             row("single enqueue, keyed", "enqueue_keyed"),
             row("single enqueue, debounced (a replacement)", "enqueue_debounced"),
             "", f"Redis bytes per key (2 jobs each, one running, one waiting for its slot) "
             f"over the same jobs without keys: {data['keyed_over_plain_bytes_per_key']} "
             f"(`used_memory`), {data.get('memory_usage_key_structures_bytes_per_key')} in "
             f"the key's own structures (`MEMORY USAGE`); a dedupe record: "
             f"{data['dedupe_record_bytes_per_key']} (`used_memory`), "
             f"{data.get('memory_usage_dedupe_record_bytes')} (`MEMORY USAGE`)."]
    checkouts = [name[:-len("_median")] for name in data if name.endswith("_median")]
    if checkouts:
        medians = [data[f"{name}_median"] for name in checkouts]
        lines += ["", "Without keys, this checkout against the baselines (medians of "
                  "alternating runs, each in a fresh Redis):", "",
                  *_header("row", *checkouts)]
        for label, key, spec in (
                ("claim + ack, jobs/s", "claim_no_keys_per_s", "{:,.0f}"),
                ("single enqueue, jobs/s", "enqueue_plain_per_s", "{:,.0f}"),
                ("Redis µs per job, claim + ack", "claim_ack_redis_us_per_job", us),
                ("Redis µs per job, single enqueue", "enqueue_redis_us_per_job", us),
                ("Redis CPU µs per job, claim + ack", "claim_ack_redis_cpu_us_per_job", us),
                ("Redis CPU µs per job, single enqueue", "enqueue_redis_cpu_us_per_job", us),
                ("bytes of a ready job's hash", "ready_job_hash_bytes", "{:,.0f}"),
                ("load average", "load", us)):
            lines.append(_row(label, *(n(m.get(key), spec) for m in medians)))
    return lines


def mirror(data: dict[str, Any]) -> Lines:
    lines = [f"The model mirror over the events of {n(data['jobs'])} no-op jobs (enqueued one "
             f"call each, claimed, started and completed {data['claim']} at a time), each "
             "run a fresh `Mirror.run(burst=True)` (`python -m bench.mirror`): **backlog** "
             "mirrors every event of the finished jobs at once, **replay** the same events "
             "delivered again, **in step** a mirror that keeps up (after each stage), "
             "**trimmed** the finished jobs' events with their hashes gone (each row "
             "built from its events alone).", "",
             *_header("database", "run", "mirror µs/job", "µs/entry", "jobs/s",
                      "Redis µs/job", "database server µs/job", "load")]
    for backend, figures in data["backends"].items():
        label = figures.get("database_version") or backend
        for run, row in figures["runs"].items():
            lines.append(_row(label, run.replace("_", " "),
                              n(row["cpu_us_per_job"], "{:,.1f}"),
                              n(row["cpu_us_per_entry"], "{:,.1f}"), n(row["jobs_per_s"]),
                              n(row["redis_cpu_us_per_job"], "{:,.1f}"),
                              n(row["database_cpu_us_per_job"], "{:,.1f}"),
                              _load(row.get("load"))))
    return [*lines, "", "CPU (user + system) of the mirror's process; on SQLite the "
            "database's work is in it, on PostgreSQL the server process of its connection "
            "is counted apart."]


#: The figures of bench.sizing: label, key, the settings that bound it.
SIZES = (
    ("a waiting (scheduled) job", "waiting", "its arguments: `MAX_PAYLOAD_BYTES`"),
    ("a ready job", "ready", "its arguments: `MAX_PAYLOAD_BYTES`"),
    ("a finished job", "finished", "`KEEP_COMPLETED` jobs a queue, `RESULT_TTL`; its "
     "result: `RESULT_MAX_BYTES`"),
    ("a failed job", "failed", "`KEEP_FAILED` jobs a queue, `FAILED_TTL`; its traceback: "
     "20,000 bytes"),
    ("an event, one job an entry", "event_single", "`EVENTS_MAXLEN`, `EVENTS_MAX_BYTES` a queue"),
    ("an event, bulk entries", "event_bulk", "`EVENTS_MAXLEN`, `EVENTS_MAX_BYTES` a queue"),
    ("a queue (its own keys)", "queue", "queues of the project; a purge forgets a queue"),
)


def sizing(data: dict[str, Any]) -> Lines:
    this, before = data["this"], data.get("baseline")
    lines = [f"Redis `used_memory` per job over {n(this['jobs'])} jobs of two small "
             "arguments, through the engine's calls (`python -m bench.sizing`; events "
             "measured apart, by the stream's `MEMORY USAGE`).", "",
             *_header("Redis bytes per", "this code", *(["before"] if before else []),
                      "bounded by")]
    for label, key, bound in SIZES:
        lines.append(_row(label, n(this[key]), *([n(before[key])] if before else []), bound))
    kept = this["kept_after"]
    row = [f"{n(kept['finished'])} jobs finished, `KEEP_COMPLETED={kept['keep_completed']}`",
           f"{n(kept['bytes'])} ({n(kept['job_records'])} job records)"]
    if before:
        old = before["kept_after"]
        row.append(f"{n(old['bytes'])} ({n(old['job_records'])} job records)")
    lines.append(_row(*row, "`KEEP_COMPLETED`"))
    return lines


#: The results file of each stand-alone script, its title and its section.
def scrape(data: dict[str, Any]) -> Lines:
    lines = ["One call of the Prometheus metrics view, each queue holding a ready and a "
             f"scheduled job, median of {data['repeat']} after a warm-up "
             "(`python -m bench.scrape`; **baseline**: the code before queue reads were "
             "pipelined).", "",
             *_header("code", "queues", "round trips", "Redis commands", "scrape ms",
                      "response bytes")]
    for row in data["rows"]:
        lines.append(_row(row["code"], n(row["queues"]), n(row["round_trips"]),
                          n(row["commands"]), n(row["scrape_ms"], "{:,.1f}"),
                          n(row["bytes"])))
    return lines


SCRIPTS: dict[str, tuple[str, Callable[[dict[str, Any]], Lines]]] = {
    "shards": ("Sharded queue on a Redis Cluster", shards),
    "workflows": ("Workflows: a group and its callback, against Celery's chord", workflows),
    "outbox": ("Transactional outbox on PostgreSQL", outbox),
    "lake": ("Job-history lake and Spark", lake),
    "spark_bulk": ("Bulk scheduling from Spark", spark_bulk),
    "bulk_enqueue": ("Bulk enqueue against single enqueues", bulk_enqueue),
    "keyed": ("Per-key flow control", keyed),
    "mirror": ("The model mirror's CPU per job", mirror),
    "scrape": ("A metrics scrape with many queues", scrape),

    "sizing": ("Redis memory per job, event and queue", sizing),
}


def scripts(others: dict[str, dict[str, Any]]) -> Lines:
    """A section per results file found, in the order of SCRIPTS."""
    lines: Lines = []
    for name, (title, section) in SCRIPTS.items():
        data = others.get(name)
        if data is None:
            continue
        lines += [f"## {title}", "", ran(data.get("environment")) or "(no run record)", "",
                  *section(data), ""]
    return lines
