"""Prometheus metrics (SPEC §13): one registry, brought up to date from the queue's rows before each collection.

Counters are rebuilt after a restart: `saigeedged_jobs_total` then starts from the number of jobs that ended in each
state and Prometheus sees an ordinary counter reset. Every end counts, a retried job's earlier ones too. The ends of
a long history are summed by SQLite into a summary kept in the database (`tallies`, moved forward daily), so a start
reads only the ends since that summary, and rows deleted by `retention.keep_rows_days` stay counted. Step durations
are observed live only.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter as Counts
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server, write_to_textfile
from prometheus_client.registry import Collector

from saigeedged import __version__, accuracytable
from saigeedged.adapters.ends import Ends
from saigeedged.adapters.store import Store
from saigeedged.adapters.tally import Tally
from saigeedged.engines import TARGETS
from saigeedged.errors import SaigeError
from saigeedged.jobs import QUEUED, RUNNING, SUCCEEDED, Job, attempt_outcome

log = structlog.get_logger()
TASKS = ("detection", "mlc", "reid")
ROLL_S = 86400.0  # how often the kept summary of ended jobs is moved forward
JOB_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, float("inf"))
STEP_BUCKETS = (0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, float("inf"))


def seconds(stamp: str) -> float:
    """UTC ISO-8601 (`...Z`, or without a zone) → seconds since the epoch."""
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or a bare `PORT` (bound to 127.0.0.1) → (host, port)."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise SaigeError("MANIFEST_INVALID", f"config: `metrics.listen` must be HOST:PORT or PORT, got {value!r}",
                         hint='e.g. metrics: {listen: "127.0.0.1:9464"}; leave it "" to serve no /metrics')
    return host, int(port)


def _target(target: str) -> str:
    """A bounded label set: a job of no known target (a manifest that never parsed) counts as `unknown`."""
    return target if target in TARGETS else "unknown"


class _Refresh(Collector):
    """Registered first: brings the metrics up to date from the queue, then yields nothing itself."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Any]:
        self.metrics.sync()
        return []


class Metrics:
    """The daemon's metrics. `engines` says which engines answer; `clock` is time.monotonic in production."""

    def __init__(self, store: Store, engines: Callable[[], dict[str, bool]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.engines, self.clock = store, engines, clock
        self.registry = CollectorRegistry()
        self.registry.register(_Refresh(self))  # collected first: the families below are current when they are read
        r = self.registry
        self.jobs_total = Counter("saigeedged_jobs", "Jobs that reached a final state", ["target", "state", "error_code"],
                                  registry=r)
        self.queue_depth = Gauge("saigeedged_queue_depth", "Jobs waiting in the queue", ["target"], registry=r)
        self.job_duration = Histogram("saigeedged_job_duration_seconds", "Run time of ended jobs (start to end)",
                                      ["target"], buckets=JOB_BUCKETS, registry=r)
        self.step_duration = Histogram("saigeedged_step_duration_seconds", "Run time of each step (this process)",
                                       ["target", "step"], buckets=STEP_BUCKETS, registry=r)
        self.engine_up = Gauge("saigeedged_engine_up", "1 when the Docker engine answered when last used", ["engine"],
                               registry=r)
        self.engine_attempts = Counter("saigeedged_engine_attempts", "Attempts of ended jobs, by engine and how they ended",
                                       ["engine", "error_code"], registry=r)
        self.cache_hits = Counter("saigeedged_cache_hits", "Jobs whose compile came from the cache", registry=r)
        self.last_success = Gauge("saigeedged_last_success_timestamp_seconds", "When a job of the target last succeeded",
                                  ["target"], registry=r)
        self.accuracy_cosine = Gauge("saigeedged_accuracy_cosine", "Worst float-vs-compiled cosine of the last measured job",
                                     ["target", "task"], registry=r)
        Gauge("saigeedged_build_info", "The running saigeedged", ["version"], registry=r).labels(__version__).set(1)
        self._ends = Ends(store)
        self._restored = False  # the counts of the ends before this start, read at the first collection
        self._tally: Tally | None = None
        self._last: dict[str, float] = {}  # target -> newest success
        self._steps: dict[str, tuple[str, str, float]] = {}  # running job id -> (target, step, when it began)
        self._lock = threading.Lock()
        self._server: Any = None

    def sync(self) -> None:
        """Count the ends not counted yet (also those written by another process, e.g. `cancel`); set the gauges."""
        depth = Counts(self.store.count_by_target(QUEUED))
        with self._lock:  # the scrape's thread and the textfile's may both be here
            if not self._restored:
                self._restore(self._ends.skip())
                self._restored = True
            for job in self._ends.fresh():
                self._count(job)
            self._roll()
            for target in sorted({*TARGETS, *depth}):
                self.queue_depth.labels(target).set(depth[target])
            for engine, up in self.engines().items():
                self.engine_up.labels(engine).set(1 if up else 0)

    def _restore(self, before: str) -> None:
        """The counters as the ends before `before` say: the summary kept in the database plus the ends since it was
        made, summed by SQLite (a long history is neither decoded here nor read again at each start); the ends from
        `before` on are counted one by one by `_count`, as they come."""
        tally = Tally.load(self.store)
        changed = tally.fill_accuracy(self.store)  # first, from the ends the summary counted up to its own mark
        if tally.before > before:  # rows deleted since, or a clock set back: the summary has those ends already
            self._ends.floor = tally.before
        elif tally.before < before:
            tally.add(self.store, before, JOB_BUCKETS)
            changed = True
        if changed:
            self._keep(tally)
        self._tally = tally
        for key, jobs in tally.jobs.items():
            target, state, code = key.split("|", 2)
            self.jobs_total.labels(_target(target), state, code).inc(jobs)
        if tally.hits:
            self.cache_hits.inc(tally.hits)
        for target, counts in tally.buckets.items():
            child = self.job_duration.labels(_target(target))
            for bucket, jobs in enumerate(counts):
                child._buckets[bucket].inc(jobs)  # prometheus_client has no public way to add observed counts
            child._sum.inc(tally.seconds.get(target, 0.0))
        for key, attempts in tally.attempts.items():
            engine, code = key.split("|", 1)
            self.engine_attempts.labels(engine, code).inc(attempts)
        self._restore_gauges(tally)

    def _restore_gauges(self, tally: Tally) -> None:
        """The last success per target and the last measured accuracy per target and task, as the summary says."""
        for target, stamp in tally.last_success.items():
            name = _target(target)
            self._last[name] = max(seconds(stamp), self._last.get(name, 0.0))
            self.last_success.labels(name).set(self._last[name])
        for key, (_, worst) in (tally.accuracy or {}).items():  # the ends from `before` on may set it again
            target, task = key.split("|", 1)
            if task in TASKS:
                self.accuracy_cosine.labels(_target(target), task).set(worst)

    def _roll(self) -> None:
        """Move the kept summary up to the ends already counted live, at most daily: the next start reads only the
        ends since (the live counters are not touched)."""
        since, tally = self._ends.since(), self._tally
        if tally is not None and since > tally.before and (not tally.before or seconds(since) - seconds(tally.before) >= ROLL_S):
            tally.add(self.store, since, JOB_BUCKETS)
            self._keep(tally)

    def _keep(self, tally: Tally) -> None:
        try:
            tally.save(self.store)
        except sqlite3.Error as exc:  # state_dir full or read-only: the next start counts these rows again
            log.warning("metrics.tally_unsaved", message=str(exc))

    def _count(self, job: Job) -> None:
        target = _target(job.target)
        self.jobs_total.labels(target, job.state, job.error["code"] if job.error else "").inc()
        if job.started_at and job.finished_at and job.step:  # it ran (a job cancelled while queued did not)
            self.job_duration.labels(target).observe(max(0.0, seconds(job.finished_at) - seconds(job.started_at)))
        if job.state == SUCCEEDED and job.finished_at:
            # rows come in queue order, not in the order they ended
            self._last[target] = max(seconds(job.finished_at), self._last.get(target, 0.0))
            self.last_success.labels(target).set(self._last[target])
        if (job.cache or {}).get("hit"):
            self.cache_hits.inc()
        worst = accuracytable.worst_cosine(job.accuracy) if job.accuracy else None
        if worst is not None and job.task in TASKS:  # tasks from the manifest schema: a bounded label set
            self.accuracy_cosine.labels(target, job.task).set(worst)
        for attempt in job.attempts:  # engine names come from the config (or "host"): a bounded label set
            self.engine_attempts.labels(attempt["engine"], attempt_outcome(attempt)).inc()

    def observe(self, job: Job) -> None:
        """Every saved job change: times the steps of the running job."""
        now = self.clock()
        with self._lock:
            began = self._steps.get(job.job_id)
            if began is not None and (job.state != RUNNING or job.step != began[1]):
                del self._steps[job.job_id]
                if job.state != QUEUED:  # a requeued job's step did not finish
                    self.step_duration.labels(began[0], began[1]).observe(max(0.0, now - began[2]))
            if job.state == RUNNING and job.step and job.job_id not in self._steps:
                self._steps[job.job_id] = (job.target, job.step, now)

    def serve(self, listen: str) -> tuple[str, int]:
        """Serve /metrics on `listen` from a background thread; returns the address bound."""
        host, port = parse_listen(listen)
        self._server, _ = start_http_server(port, host, registry=self.registry)
        bound: tuple[str, int] = self._server.server_address[:2]
        return bound

    def write_textfile(self, path: str) -> None:
        """The same metrics for node_exporter's textfile collector (temp name beside it, then rename)."""
        write_to_textfile(path, self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
