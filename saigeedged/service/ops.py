"""The ops surfaces in the daemon (SPEC §13): metrics, notifications, retention and the dashboard, fed by job changes.

`observe` is called on every saved job change, from the worker's or the loop's thread: it only records and wakes
this module's own thread, so no surface can delay a claim or a compile, and none can fail a job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from saigeedged import jobid
from saigeedged.adapters import dashboard, retention
from saigeedged.adapters.dashboard import Slot, View
from saigeedged.adapters.ends import Ends
from saigeedged.adapters.metrics import Metrics, parse_listen
from saigeedged.adapters.outbox import place_data
from saigeedged.adapters.slurm.cluster import Slurm, images
from saigeedged.adapters.store import Store
from saigeedged.adapters.webhooks import Channel, Sender, channels
from saigeedged.config import Config, in_file
from saigeedged.errors import SaigeError
from saigeedged.executor import ClusterNode, serves
from saigeedged.jobs import QUEUED, RUNNING, TERMINAL, Job
from saigeedged.service.lifecycle import Places
from saigeedged.service.statusline import configured, slot_views

log = structlog.get_logger()
PAGE_MIN_S = 1.0  # the dashboard is rewritten at most this often
PAGE_MAX_S = 30.0  # ... and at least this often (changes made by other processes, e.g. `cancel`, and its clock)
TEXTFILE_S = 15.0
TICK_S = 5.0  # the thread looks at least this often
RETENTION_S = 86400.0
LISTEN_AGAIN_S = 30.0  # a /metrics address taken at start-up (another process held the port) is tried this often


def surfaces(config: Config) -> list[Channel]:
    """The ops surfaces' keys checked as the start-up checks them (a bad one stops it, as any bad key does; `saigeedged
    check` says so too): the /metrics address, and the notify channels, returned."""
    try:
        if config.metrics.listen:
            parse_listen(config.metrics.listen)
        return channels(list(config.notify))
    except SaigeError as exc:
        raise in_file(exc, config.source) from None


class Ops(threading.Thread):
    """The surfaces the config turns on; the engines' health is what the engine monitor recorded in the store."""

    def __init__(self, config: Config, store: Store, clock: Callable[[], float] = time.monotonic,
                 slurm: Slurm | None = None) -> None:
        super().__init__(name="saigeedged-ops", daemon=True)
        self.config, self.store, self.clock = config, store, clock
        self.listen, self.textfile = config.metrics.listen, config.metrics.textfile
        chans = surfaces(config)
        wanted = bool(self.listen or self.textfile)
        self.metrics = Metrics(store, self.engines_up, clock) if wanted else None
        self.sender = Sender(chans) if chans else None
        self.dashboard = config.dashboard
        self.ends = Ends(store)
        # ends made where the observer never sees them (`saigeedged cancel` of a queued job, in a shell) are looked for
        # when something shows them: a notification, the page
        self.follow_ends = self.sender is not None or self.dashboard
        if self.follow_ends:  # what ended before this start was notified then, or never will be
            self.ends.skip()  # by index: a long history is not read
            self.ends.fresh()  # ... nor the look-back window's ends
        self.policy = retention.Policy.from_config(config.retention)
        self.outputs = retention.Outputs(config.outbox, Places(config.inbox, config.state_dir).failed)
        # its nodes stand for the engines; the pool's (`slurm`), whose workers leave nodes out (unfit.py)
        self.slurm = slurm or (Slurm(config.executor) if config.executor.slurm else None)
        self.stop_event, self.changed = threading.Event(), threading.Event()
        self._page_stale = False
        self._last = dict.fromkeys(("page", "textfile", "retention"), float("-inf"))
        self._listen_at: float | None = float("-inf")  # when /metrics is tried next (None: served)

    def observe(self, job: Job) -> None:
        """A job was saved: time its steps, queue its notification, mark the page stale. Never raises."""
        try:
            if self.metrics is not None:
                self.metrics.observe(job)
            if self.sender is not None and job.state in TERMINAL:
                self.sender.job_ended(job)
        except Exception as exc:  # a guard: an ops surface must never fail a job
            log.error("ops.failed", job_id=job.job_id, error_code="INTERNAL", message=f"{type(exc).__name__}: {exc}")
        self.changed.set()

    def start(self) -> None:
        self._listen(self.clock())
        if self.sender is not None:
            self.sender.start()
        super().start()

    def _listen(self, now: float) -> None:
        """Serve /metrics; an address another process holds is said once and tried again every LISTEN_AGAIN_S."""
        if self.metrics is None or not self.listen or self._listen_at is None or now < self._listen_at:
            return
        try:
            host, port = self.metrics.serve(self.listen)
        except OSError as exc:  # compiles matter more than their metrics: say it loudly and go on
            if self._listen_at == float("-inf"):
                log.error("metrics.unavailable", address=self.listen,
                          message=f"{exc}; tried again every {LISTEN_AGAIN_S:.0f}s")
            self._listen_at = now + LISTEN_AGAIN_S
            return
        self._listen_at = None
        log.info("metrics.listening", address=f"{host}:{port}")

    def stop(self, timeout: float = 5) -> None:
        self.stop_event.set()
        self.changed.set()
        if self.sender is not None:
            self.sender.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.is_alive():
            self.join(timeout=timeout)  # a page or textfile being written is finished, not left as a temp file

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick(self.clock())
            except Exception as exc:  # a guard: the next tick tries again
                log.error("ops.failed", error_code="INTERNAL", message=f"{type(exc).__name__}: {exc}")
            self.stop_event.wait(PAGE_MIN_S)  # changes meanwhile wait for the next tick: at most one page a second
            self.changed.wait(TICK_S)

    def tick(self, now: float) -> None:
        """Whatever is due: the page (changed, or PAGE_MAX_S old), the textfile, a retention round."""
        self._listen(now)
        stale = self.changed.is_set()
        self.changed.clear()
        ended = self.ends.fresh() if self.follow_ends else []  # (the page listed a shell's cancel as queued on)
        self._page_stale = self._page_stale or stale or bool(ended)
        last = self._last["page"]
        if self.dashboard and now >= last + PAGE_MIN_S and (self._page_stale or now >= last + PAGE_MAX_S):
            self._last["page"], self._page_stale = now, False
            self.write_page()
        if self.metrics is not None and self.textfile and (stale or now >= self._last["textfile"] + TEXTFILE_S):
            self._last["textfile"] = now
            self.write_textfile()
        if self.sender is not None:
            for job in ended:
                self.sender.job_ended(job)
        if self.policy.enabled and now >= self._last["retention"] + RETENTION_S:  # after start, then daily
            self._last["retention"] = now
            retention.prune(self.store, self.outputs, self.policy, time.time())

    def engines_up(self) -> dict[str, bool]:
        """Each configured engine's last recorded state (SPEC §11, §15: one engine is a pool of one); with executor
        slurm each node of the partition as sinfo says."""
        if self.slurm is not None:
            return {n.name: n.up for n in self._nodes()}
        return {e.name: e.up for e in configured(self.config, self.store.engines())}

    def _nodes(self) -> list[ClusterNode]:
        assert self.slurm is not None
        try:
            return self.slurm.nodes()
        except SaigeError:  # the controller does not answer: no node is known to be up
            return []

    def _slots(self, running: list[Job]) -> list[Slot]:
        """The dashboard's rows: an engine's slots, or a node of the partition with the targets it serves and what it
        is left out of, and why."""
        if self.slurm is not None:
            wanted, left_out = images(self.config), self.slurm.left_out.listed()
            return [Slot(n.name, ", ".join([", ".join(serves(n, wanted)) or "-",
                                            *(f"{left.of}: {left.why}" for left in left_out if left.node == n.name)]),
                         n.up, None) for n in self._nodes()]
        pool = configured(self.config, self.store.engines())
        ups = {e.name: e.up for e in pool}
        return [Slot(s.engine, s.target, ups[s.engine], s.job) for s in slot_views(pool, running) if s.engine in ups]

    def view(self) -> View:
        running = self.store.in_state(RUNNING)  # the rows, not the workers: one truth per page
        slots = self._slots(running)
        hosts = [job for job in running if job.target == "host" and not job.finishing]  # the one compiling (the last
        # taken), not those the finishing stage holds
        slots.append(Slot("this host", "host", True, max(hosts, key=lambda j: j.started_at or "", default=None)))
        return View(jobid.iso(jobid.utc_now()), slots, running, self.store.head(QUEUED, dashboard.QUEUE_SHOWN),
                    self.store.recent(dashboard.RECENT), self.store.count(QUEUED))

    def write_page(self) -> None:
        try:
            place_data(dashboard.render(self.view()).encode(), dashboard.page_path(self.config.outbox))
        except SaigeError as exc:  # the share refuses it now: the next change or PAGE_MAX_S tries again
            log.warning("dashboard.write_failed", error_code=exc.code, message=exc.message)

    def write_textfile(self) -> None:
        assert self.metrics is not None
        try:
            self.metrics.write_textfile(self.textfile)
        except OSError as exc:
            log.warning("metrics.textfile_failed", path=self.textfile, message=str(exc))
