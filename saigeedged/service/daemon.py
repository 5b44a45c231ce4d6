"""The run loop: recovery, scanning and claiming, the worker, sd_notify, and a clean stop (SPEC §3, §8, §9)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from saigeedged import guards, jobid
from saigeedged.adapters.events import event
from saigeedged.adapters.joblog import JobLog
from saigeedged.adapters.notify import Notifier
from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store, StoreFull
from saigeedged.compile import child
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.intake import claims, inbox, ownfolders
from saigeedged.intake.inbox import Drop, Rejected, Scanner
from saigeedged.intake.watch import Watcher, use_polling
from saigeedged.jobs import FAILED, QUEUED, RUNNING, TERMINAL, Attempt, Job, entry_to_doc, status_text
from saigeedged.manifest import safe_stem
from saigeedged.service import ahead, legacy, room
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.ops import Ops
from saigeedged.service.pool import Pool
from saigeedged.service.recovery import Recovery

log = structlog.get_logger()
CANCEL_POLL_S = 1.0  # how often the loop looks for `saigeedged cancel` requests when nothing else wakes it
# Our own claim renames move files into a fresh claimed/<job_id>/ that inotify does not watch yet; watchdog holds
# such an unpaired IN_MOVED_FROM back ~0.5 s to pair it, and every later event waits behind it. While that lasts
# the loop scans on its own every BLIND_SCAN_S, so a drop arriving right after a claim is not claimed late.
BLIND_WINDOW_S = 0.6
CATCH_UP_S = 5.0  # how often status files and logs the outbox refused are tried again
BLIND_SCAN_S = 0.05
STOP_GRACE_S = 25.0  # how long a stop waits in all (SPEC: exit within 30 s; the unit's TimeoutStopSec is 45 s)
STOP_AFTER_S = 4.0  # of which kept for what stops after the worker (the ops page, the preparer, the inbox watch)
AHEAD_STOP_S = 2.0  # the preparer's child is killed within child.POLL_S of a stop; longer means it is stuck (a share)


class Daemon:
    """One daemon process. `stop` is set by the signal handlers; `clock` is time.monotonic in production."""

    def __init__(self, config: Config, stop: threading.Event, notifier: Notifier | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.stop, self.clock = config, stop, clock
        self.notifier = notifier or Notifier()
        self.places = Places(config.inbox, config.state_dir)
        self.places.make(config.outbox)
        self.store = Store(config.state_dir / "saigeedged.db")
        self.room = room.Waiting(stop, clock)  # a worker's write on a full state_dir waits for space
        self.store.wait_for_room = self.room
        self.jobs = Jobs(self.store, Outbox(config.outbox), self.places)
        self.recovery = Recovery(self.jobs, config.limits.max_attempts,
                                 lambda job, work: legacy.rebuild(job, work, config))
        watch = config.watch
        self.scanner = Scanner(config.inbox, watch.settle_s, watch.orphan_timeout_s, config.defaults.as_dict(),
                               max_digest_bytes=config.limits.max_onnx_bytes)
        self.polling = use_polling(watch.mode, config.inbox)
        self.wake = threading.Event()
        self.watcher = None if self.polling else Watcher(config.inbox, self.wake)
        self._status_lock = threading.Lock()
        self._blind_until = 0.0  # see BLIND_WINDOW_S
        self._next_catch_up = 0.0
        self._hung_up = False  # set by the SIGHUP handler: a plain flag, no lock in signal context
        self._unmoved: set[Path] = set()  # manifests whose files could not be claimed or go to failed/ (said once)
        self.pool = Pool(config, self.jobs, self.places, self._container_event,
                           lambda: log.info("container.lock_wait", state_dir=str(config.state_dir)), self._changed, clock)
        self.ahead = ahead.attach(config, self.store, self.pool)
        self.ops = Ops(config, self.store, slurm=self.pool.slurm)
        self.jobs.observers.append(self.ops.observe)

    @staticmethod
    def _container_event(name: str, fields: dict[str, object]) -> None:
        warned = ("container.restarted", "container.recreate_failed", "container.stale_mount")
        getattr(log, "warning" if name in warned else "info")(name, **fields)

    # -- start-up ------------------------------------------------------------------------------
    def recover(self) -> None:
        """Jobs left running by a crash or a stop go back to the queue (or end failed past limits.max_attempts);
        their leftover steps are killed; claimed folders without rows and leftover temp files are settled."""
        self.recovery.temp_files()
        self.recovery.unrecorded_bundles(self.store.forget_publishing())
        interrupted = self.store.in_state(RUNNING)
        attached = [j for j in interrupted if j.target in CONTAINER_TARGETS and self._resumable(j)]
        for job in self.pool.resume(attached) + [j for j in interrupted if j.target not in CONTAINER_TARGETS]:
            self.recovery.interrupted(job, self.config.limits.max_attempts)
        self.recovery.claims()
        if not self.config.keep_work:
            self.recovery.work_dirs(self.config.work_root, self.pool.reaping())
        if self.store.created:
            self.recovery.lost_statuses()
        leftover = sorted(self.places.logs.glob("*.log"))
        self.jobs.strand([j.job_id for p in leftover if (j := self.store.get(p.stem)) and j.state in TERMINAL])
        self.jobs.ended_unwritten()

    def _resumable(self, job: Job) -> bool:
        """A container job the last daemon left running goes on in its attempt (its step outlives daemons, SPEC §15),
        unless its record cannot be resumed (unreadable, another version's, host steps' results gone beside a started
        step) or daemons keep dying under it: then its step is killed and it runs again or ends failed."""
        left = self.recovery.attempt_left(job, self.pool.work_dir(job))
        if left.resumable:
            return True
        self.pool.abandon([Attempt.of(job)])
        if left.crashes >= self.config.limits.max_attempts:
            self.recovery.died_under(job, left.crashes)
        else:
            self.recovery.interrupted(job, self.config.limits.max_attempts)
        return False

    # -- claiming ------------------------------------------------------------------------------
    def _subdir(self, manifest: Path) -> str:
        """The drop's folder relative to the inbox ("" at the top), kept in the outbox."""
        rel = manifest.parent.relative_to(self.config.inbox).as_posix()
        return "" if rel == "." else rel

    def claim(self, drop: Drop) -> None:
        refused = guards.subdir_problem(self._subdir(drop.manifest))
        if refused:
            self.reject(Rejected(drop.manifest, SaigeError("MANIFEST_INVALID", refused), drop.files))  # its ONNX too
            return
        now = jobid.utc_now()
        ids = [jobid.new(e.stem, now) for e in drop.entries]
        claim_dir = self.places.claimed / ids[0]
        try:
            ownfolders.ensure(self.places.claimed, self.config.inbox)
            claims.write_record(claim_dir, drop.manifest.parent, drop.files)  # first: a kill mid-claim is undone
            moved = inbox.claim(drop.files, drop.manifest.parent, claim_dir, self.config.inbox)
        except OSError as exc:  # a file vanished or was replaced under us: the next scan decides again
            shutil.rmtree(claim_dir, ignore_errors=True)
            if drop.manifest not in self._unmoved:  # a folder it cannot rename in fails it at every scan: said once
                log.warning("drop.ignored", manifest=str(drop.manifest), message=f"claim failed: {exc}; tried again "
                            "at each scan")
            self._unmoved.add(drop.manifest)
            return
        self._unmoved.discard(drop.manifest)
        self.scanner.forget(drop.files)
        if self.watcher is not None:
            self._blind_until = self.clock() + BLIND_WINDOW_S
        jobs = []
        for job_id, entry in zip(ids, drop.entries, strict=True):
            doc = entry_to_doc(entry)
            doc["onnx"] = str(moved.get(entry.onnx, entry.onnx))
            doc["manifest"] = str(moved[drop.manifest])
            jobs.append(Job(job_id=job_id, name=entry.stem, target=entry.target, task=entry.task, entry=doc,
                            subdir=self._subdir(drop.manifest), claim_dir=str(claim_dir),
                            manifest=guards.printable(drop.manifest.name),
                            priority=entry.priority, request_id=entry.request_id, created_at=jobid.iso(now),
                            updated_at=jobid.iso(now)))
        try:
            claims.write_record(claim_dir, drop.manifest.parent, drop.files, jobs)
            for job in jobs:
                event("drop.claimed", job, manifest=job.manifest, priority=job.priority)  # before job.started
                self.jobs.add(job)
        except Exception as exc:  # a row that cannot be written: the record lets recovery finish or fail the claim
            log.error("claim.unqueued", claim=str(claim_dir), error_code="INTERNAL", message=f"{type(exc).__name__}: {exc}")
            self.recovery.claims()
        self.pool.wake.set()

    def reject(self, bad: Rejected) -> None:
        """A manifest that cannot compile becomes a failed job with its error; its files go to failed/."""
        now = jobid.utc_now()
        stem = safe_stem(str(bad.error.fields.get("drop_name") or bad.manifest.stem))  # as the manifest named it
        job_id = jobid.new(stem, now)
        dest = self.places.failed / job_id
        try:
            ownfolders.ensure(self.places.failed, self.config.inbox)
            inbox.claim(bad.files, bad.manifest.parent, dest, self.config.inbox)
        except OSError as exc:  # (a file held open on a share, a read-only folder): tried again at the next scans
            if bad.manifest not in self._unmoved:
                log.warning("drop.ignored", manifest=str(bad.manifest), error_code=bad.error.code,
                            message=f"{bad.error.message}; its files cannot go to failed/ ({exc}): tried again at "
                            "each scan")
            self._unmoved.add(bad.manifest)
            return
        self._unmoved.discard(bad.manifest)
        self.scanner.forget(bad.files)
        onnx = next((str(dest / p.name) for p in bad.files if p.suffix == ".onnx"), str(dest / f"{stem}.onnx"))
        job = Job(job_id=job_id, name=stem, target="?", task="?", entry={"onnx": onnx}, subdir=self._subdir(bad.manifest),
                  claim_dir=str(dest), manifest=guards.printable(bad.manifest.name), state=FAILED, created_at=jobid.iso(now),
                  updated_at=jobid.iso(now), finished_at=jobid.iso(now), error=bad.error.as_dict("validate"),
                  request_id=guards.printable(str(bad.error.fields.get("request_id") or "")) or None)
        with JobLog(self.places.local_log(job_id)) as joblog:
            joblog.line(f"### {job.manifest}: {bad.error.code}: {bad.error.message}\n### hint: {bad.error.hint}")
        self.jobs.move_log(job)
        event("drop.invalid", job, "warning", manifest=job.manifest, message=bad.error.message)
        self.jobs.add(job)  # the status file last: its reader finds everything else done

    def scan(self) -> None:
        found_now = self.scanner.scan(self.clock())
        for link in self.scanner.new_symlinks:
            log.info("drop.ignored", path=str(link), message="symlinks in the inbox are never followed")
        if self.scanner.too_deep and self.watcher is not None:
            self._too_deep()
        for found in found_now:
            if self.stop.is_set():
                return
            if isinstance(found, Drop):
                self.claim(found)
            else:
                self.reject(found)

    def _guarded_scan(self) -> None:
        """One bad file must not stop the daemon: an unexpected error is logged and the next scan tries again."""
        try:
            self.scan()
            if self.recovery.claims():  # a claim whose rows could not be written before (state_dir full, read-only)
                self.pool.wake.set()
        except Exception as exc:  # a guard, not control flow: everything expected is handled inside scan()
            log.error("scan.failed", error_code="INTERNAL", message=f"{type(exc).__name__}: {exc}")

    # -- the loop ------------------------------------------------------------------------------
    def hang_up(self) -> None:
        """SIGHUP: scan the inbox now (a share whose events do not reach us); the config is read at start only."""
        self._hung_up = True
        self.wake.set()

    def _answer_hangup(self) -> None:
        if self._hung_up:
            self._hung_up = False
            log.info("daemon.hangup", message="rescanning the inbox now; the config is read at start only: "
                     "`systemctl restart saigeedged` applies changes")
            self.wake.set()

    def _too_deep(self) -> None:
        """inotify follows a deep tree folder by folder and falls minutes behind: poll instead, at bounded depth."""
        log.warning("watch.too_deep", path=str(self.scanner.too_deep[0]), mode="poll",
                    message=f"folders deeper than {inbox.MAX_DEPTH} levels are never scanned, and inotify cannot keep "
                    "up with them: polling the inbox instead (remove the tree and restart to watch by events again)")
        assert self.watcher is not None
        self.watcher.stop(timeout=0)  # its thread may be busy in the tree: not waited for
        self.watcher, self.polling = None, True

    def _watcher_check(self, period: float) -> float:
        """A dead inotify observer (a tree it cannot follow) hands over to polling; returns the scan period."""
        if self.watcher is not None and not self.watcher.alive():
            log.warning("watch.failed", mode="poll", message="the inotify observer stopped: polling the inbox instead")
            self.watcher, self.polling = None, True
        return self.config.watch.poll_interval_s if self.polling else period

    def healthy(self) -> bool:
        """Every worker alive, none stuck in an engine call far past its bounds, the watcher alive: else no watchdog
        ping, and systemd restarts the daemon (the steps run on and are re-attached)."""
        return self.pool.is_alive() and not self.pool.monitor.stuck() and (self.watcher is None or self.watcher.alive())

    def _check_cancel(self) -> None:
        """`saigeedged cancel` flags a running row: the job ends cancelled now, held for its engine or not."""
        for job in [j for w in self.pool.workers for j in w.owned()]:
            if self.store.cancel_requested(job.job_id):
                self.pool.cancel(job.job_id)

    def _writes(self, now: float) -> None:
        """The main loop's own writes: cancels, a deleted database, the outbox's catch-up. A full state_dir makes
        them wait for the next round (never for space here: the watchdog pings go on)."""
        try:
            self._check_cancel()
            if self.store.restore_if_deleted():
                log.error("store.restored", path=str(self.store.path), error_code="INTERNAL",
                          message="the job database was deleted while running; rewritten from the open one")
            self._catch_up(now)
        except StoreFull:
            pass  # said once by self.room (state.full, STATUS=); the next round tries again

    def _catch_up(self, now: float) -> None:
        if now >= self._next_catch_up and self.jobs.behind():
            self._next_catch_up = now + CATCH_UP_S
            ended = self.jobs.catch_up()  # and the ends a command made: `saigeedged cancel` of a queued job
            self.pool.ended_by_command([job for job in map(self.store.get, ended) if job is not None])

    def _changed(self) -> None:
        """The worker's job or step changed: STATUS= follows, and the preparer looks whether a compile started."""
        self._status()
        if self.ahead is not None:
            self.ahead.wake.set()

    def _status(self) -> None:
        """STATUS= from the main loop and from the worker at each job and step change."""
        with self._status_lock:
            self.notifier.status(self.pool.status(self.store.count(QUEUED)) + self.room.status())

    def run(self) -> int:
        if room.start_degraded(self.recover, self.stop, self.notifier, self.clock) is None and self.stop.is_set():
            self.store.close()
            return 0
        if self.watcher is not None:
            try:
                self.watcher.start()
            except OSError as exc:  # e.g. fs.inotify.max_user_watches reached: scanning alone still finds every drop
                log.warning("watch.unavailable", message=str(exc), mode="poll")
                self.watcher, self.polling = None, True
        self.pool.start()
        if self.ahead is not None:
            self.ahead.start()
        self.ops.start()
        watch = self.config.watch
        period = watch.poll_interval_s if self.polling else watch.rescan_interval_s
        next_scan = self.clock()
        log.info("daemon.ready", inbox=str(self.config.inbox), outbox=str(self.config.outbox),
                 mode="poll" if self.polling else "events", queued=self.store.count(QUEUED))
        self.notifier.ready(status_text(None, self.store.count(QUEUED)))
        while not self.stop.is_set():
            self._answer_hangup()
            period = self._watcher_check(period)
            next_scan = min(next_scan, self.clock() + period)
            now = self.clock()
            due = self.scanner.next_due
            blind = now < self._blind_until
            if self.wake.is_set() or blind or now >= next_scan or (due is not None and now >= due):
                self.wake.clear()
                self._guarded_scan()
                next_scan = now + period if now >= next_scan else next_scan
            self._writes(now)
            self._status()
            if self.healthy():
                self.notifier.watchdog(self.clock())
            waits = [next_scan - now, CANCEL_POLL_S] + ([due - now] if (due := self.scanner.next_due) else [])
            if self.notifier.interval:
                waits.append(self.notifier.interval)
            if blind:
                waits.append(BLIND_SCAN_S)
            self.wake.wait(max(0.01, min(waits)))
        return self.shutdown()

    def shutdown(self) -> int:
        """Stop claiming, kill the running step, requeue its job, exit 0."""
        self.notifier.stopping()
        log.info("daemon.stopping", running=",".join(w.current.job_id for w in self.pool.running() if w.current) or None,
                 message="container steps run on and are re-attached at the next start")
        deadline = time.monotonic() + STOP_GRACE_S  # one budget for every wait of the stop (SPEC §15: out in 30 s)

        def left(most: float) -> float:
            return max(0.5, min(most, deadline - time.monotonic()))

        self.pool.stop()
        if self.ahead is not None:
            self.ahead.stop()
        self.pool.join(timeout=left(STOP_GRACE_S - STOP_AFTER_S))
        self.ops.stop(timeout=left(5))
        if self.ahead is not None:
            self.ahead.join(left(AHEAD_STOP_S))
        if self.pool.stopped() and not (self.ahead is not None and self.ahead.is_alive()):
            child.shutdown()  # the fork server and the resource tracker end with us, not by systemd's SIGKILL
        if self.watcher is not None:
            self.watcher.stop(timeout=left(5))
        if not self.pool.stopped():  # e.g. blocked on a hung engine: its row stays `running`, requeued at next start
            log.error("daemon.stop_timeout", message=f"the running job or an engine's watch did not stop within "
                      f"{STOP_GRACE_S - STOP_AFTER_S:.0f}s; a running job runs again at the next start")
        elif not self.ops.is_alive() and not (self.ahead is not None and self.ahead.is_alive()):
            self.pool.close()
            self.store.close()  # never under a live thread that may still use it (the worker, the ops page, the
            # preparer: sqlite under a read of a closed connection crashes the process)
        return 0
