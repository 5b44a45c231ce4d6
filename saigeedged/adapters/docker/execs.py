"""Steps exec'd in a compiler container: wrapped in `timeout`, streamed, killed by pidfile, reaped after a crash."""

from __future__ import annotations

import contextlib
import shlex
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from saigeedged import files as filesmod
from saigeedged.adapters.docker import detached, stream
from saigeedged.adapters.docker.api import ENGINE_ERRORS, APIError, ContainerRef, DockerAPI, NotFound
from saigeedged.adapters.docker.lifecycle import Lifecycle, OnEvent, image_of, root_id
from saigeedged.adapters.docker.spec import MANAGED_LABEL, Spec, exec_user
from saigeedged.errors import SaigeError

KILL_AFTER = "30s"
LOST_GRACE_S = 2  # how long a step killed by a signal waits to see whether its whole container is going down
PIDFILE = ".step.pid"
STOPFILE = ".step.stop"  # beside the pidfile: a cancel for this job's steps, holding its reason
VARIANT_DIRS = "variant"  # a sweep's variants run their steps in <work>/variantN/ (compile/variants.py)
# by path: a busybox sh would run its own applet for a bare `timeout` (coreutils lives here on Ubuntu)
TIMEOUT_BIN = "/usr/bin/timeout"
# Each pidfile $f is read in its folder, entered by `cd -P` only when that folder's parent is the one its path names (a
# folder a step replaced by a link, to another job's, is skipped), in a subshell. A pid from it ($p) is signalled only
# when it is one of that attempt's: digits, and a process working in that very folder (the wrapper and `timeout` run
# there). The pidfile lies in the folder the step writes: a pid it put there (another job's step, the container's
# init; `1` made `kill -- -1`, every process) is skipped.
_HERE = 'd=${f%/*}; cd -P "$d" 2>/dev/null && [ .. -ef "${d%/*}" ] || exit 0; '
_OURS = 'case $p in ""|*[!0-9]*) continue ;; esac; [ "/proc/$p/cwd" -ef . ] || continue; '
# $0 and every further argument: pidfiles of one attempt's folders (its own, its variants'); the stop file is made
# inside the container too, by the path the container sees (not through a link a step put there)
_KILL = (f'for f in "$0" "$@"; do ({_HERE}[ -L {STOPFILE} ] || touch {STOPFILE} 2>/dev/null; '
         f'for p in $(cat {PIDFILE} 2>/dev/null); do {_OURS}'
         f'kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; done; rm -f {PIDFILE}); done')
# $0 and every further argument: pidfiles of attempts to end (their folders removed after)
_REAP = (f'for f in "$0" "$@"; do ({_HERE}for p in $(cat {PIDFILE} 2>/dev/null); do {_OURS}'
         f'kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done); rm -rf "${{f%/*}}"; done; true')
Sink = Callable[[bytes], None]


def folders(workdir: Path) -> list[Path]:
    """The folders of an attempt whose steps have a pidfile: its variants' (a sweep's, each its own steps; a link a
    step put there is none of them), then its own."""
    try:
        names = sorted(p.name for p in workdir.iterdir() if p.name.startswith(VARIANT_DIRS) and not p.is_symlink())
    except OSError:  # no work folder (yet, or any more)
        names = []
    return [*(workdir / n for n in names), workdir]


class Container(Lifecycle):
    """A compiler container and the steps run in it (the work root bind-mounted at its own path)."""

    def __init__(self, api: DockerAPI, spec: Spec, on_event: OnEvent) -> None:
        super().__init__(api, spec, on_event)
        self.probe_failure = ""  # what the last entry-point probe that found nothing said, for the error message
        self._steps: dict[str, int] = {}  # work dir -> steps its attempt started so far (their numbers in .steps/)
        self.book: detached.Book = detached.FileBook()  # set per job by Containers.get: the daemon's is the store
        # why the job using it must end ("cancel"; a daemon stop is run_step's `stopping`), set per job by
        # Containers.get: the worker's own word, never the stop file, which any step in the container could write
        self.interrupted: Callable[[], str | None] = lambda: None

    def _exec(self, ctr: ContainerRef, argv: Sequence[str], workdir: str, env: dict[str, str] | None,
              sink: Sink) -> int | None:
        """Run a short fixed command, its output to `sink`; its exit code, None if it was cut off.

        Every wait is bounded by the client's timeout (limits.engine_timeout_s): the output is read from the raw
        socket (stream.drain), and the end is awaited for that long at most; TimeoutError (an UNREACHABLE) past it."""
        api = self.docker.api
        exec_id = str(api.exec_create(ctr.id, list(argv), user=exec_user(self.spec.user), workdir=workdir,
                                      environment=env)["Id"])
        sock = api.exec_start(exec_id, socket=True)
        try:
            stream.drain(sock, api.timeout, sink)
        finally:
            sock.close()
        deadline = time.monotonic() + api.timeout
        while True:  # the stream ends on a broken connection too: only exec_inspect decides
            info = api.exec_inspect(exec_id)
            if not info["Running"]:
                code = info.get("ExitCode")
                return None if code is None else int(code)
            if time.monotonic() >= deadline:
                raise stream.Stalled(f"exec {argv[0]} still runs {api.timeout:g}s after its output ended")
            time.sleep(0.02)

    def _ensure(self) -> ContainerRef:
        """Lifecycle's, and a container that does not see the host's work root made afresh (sees_work_root)."""
        ctr = super()._ensure()
        if self._sees_work_root(ctr):
            return ctr
        name, root = self.spec.name, self.spec.work_root
        if ctr.labels.get(MANAGED_LABEL) != "1":
            raise SaigeError("CONTAINER_FAILED", f"container {name} does not see the work root {root}: its bind mount "
                             "holds a folder since removed or made again, and saigeedged did not create it",
                             hint=f"`docker rm -f {name}`: saigeedged then makes its own")
        self.on_event("container.stale_mount", {"container": name, "work_root": str(root)})
        ctr.remove(force=True)
        self._probed.clear()
        return super()._ensure()

    def _sees_work_root(self, ctr: ContainerRef) -> bool:
        """Does the container see the folder the work root is now? Its bind mount holds the folder that was there when
        it was made: after the state dir was removed and made again (cleaned by hand, a purge and a reinstall) it holds
        the removed one, and every step fails to enter its work dir. Asked (one exec: a file made for it here, looked
        for in there) only when the work root is not the folder last seen there; only a clear "not there" is False."""
        root = self.spec.work_root
        root.mkdir(parents=True, exist_ok=True)
        now = root_id(root)
        if now == self._root_seen:
            return True
        mark = root / f".saigeedged-mount-{uuid.uuid4().hex}"
        try:
            mark.touch()
        except OSError:  # a work root the daemon cannot write in: the steps say so, in their own words
            return True
        try:
            code = self._exec(ctr, ["sh", "-c", 'test -e "$0"', str(mark)], "/", None, lambda _: None)
        except APIError:  # the engine refused the exec: the step's own exec says so in its words, asked again later
            return True
        finally:
            mark.unlink(missing_ok=True)
        if code == 1:
            return False
        self._root_seen = now  # there, or a check that could not run: the steps say what is wrong
        return True

    def probe(self, script: str) -> tuple[int, str]:
        """Run a fixed shell snippet (no manifest values) and return (exit code, output)."""
        chunks: list[bytes] = []
        with self._reach("probing the container"):
            code = self._exec(self.ensure(), ["sh", "-c", script], "/", None, chunks.append)
        return (-1 if code is None else code), b"".join(chunks).decode(errors="replace")

    def entry_point(self, key: str, script: str) -> str:
        """The cached output of an entry-point probe, re-probed after every container start."""
        if key not in self._probed:
            for _ in range(2):  # once more: a probe cut short (a busy engine) must not pass for "not in the image"
                code, out = self.probe(script)
                lines = out.strip().splitlines() if code == 0 else []
                if lines:
                    self._probed[key] = lines  # only a found entry point is kept: a miss is probed again next job
                    break
            else:
                self.probe_failure = f"probe exit {code}: {out.strip()[-200:]!r}"
                return ""
        return self._probed[key][0]

    def run_step(self, argv: Sequence[str], workdir: Path, timeout_s: int, sink: Sink,
                 env: dict[str, str] | None = None, replay: Sink | None = None,
                 stopping: detached.Stopping = lambda: False, number: int | None = None) -> int:
        """One compiler step under `timeout --kill-after`, started detached (SPEC §15); returns its exit code.

        Steps are numbered in the order a job's attempt runs them, so a daemon started again in the same attempt finds
        each one in `.steps/`: a step that ended gives its code at once, one still running is followed on. Output the job
        log already has (written before a restart) goes to `replay` only, the rest to `sink` too. `stopping()`: stop
        following and leave the step running (CANCELLED, reason stop, detached). `number`: a number of its own instead
        of the next in order (a step whose place in the order a replay may not give it again).
        """
        ctr = self.ensure()
        files = detached.Files(workdir, self._next_step(workdir) if number is None else number, self.book)
        label = shlex.join(argv[:3])
        if not files.started():
            self.raise_if_cancelled(argv)  # a cancel that came between steps is not erased by this one
            with self._reach(f"starting {label}"):
                self._launch(ctr, files, argv, timeout_s, env)
        # timed as an engine call is only the follow's exec_inspect: the step itself may run for hours, and counted as
        # one call it made the engine slow past engine_timeout_s, then the daemon unhealthy (systemd's watchdog kill)
        def may_start(exec_id: str) -> None:  # a step re-attached to that was never started: as a launch does, first
            self.raise_if_cancelled(argv)
            files.book.launched(files.work, files.n, exec_id)  # Superseded: the attempt is over

        code = detached.Follower(self.docker, files, sink, replay, self._reach, may_start).follow(stopping)
        self.raise_if_cancelled(argv)  # the cancel's own kill: whether the container died too does not matter
        lost = self._lost(ctr, code)  # (its grace also lets a cancel of a re-attached job reach the worker first)
        self.raise_if_cancelled(argv)
        if lost:
            raise SaigeError("CONTAINER_LOST", f"container {self.spec.name} died during {label}")
        return code

    def raise_if_cancelled(self, argv: Sequence[str]) -> None:
        """CANCELLED when the worker was told to end the job (its reason: a cancel). The stop file is only for the
        steps' wrapper (a step started in a cancel's race never runs): one planted by a step neither cancels a job nor
        detaches it for ever (a planted `stop` did, at every start); the step it keeps from running fails."""
        reason = self.interrupted()
        if reason is not None and reason != "stop":
            raise SaigeError("CANCELLED", f"step {shlex.join(argv[:3])} was stopped ({reason})", reason=reason)

    def beside(self) -> Container | None:
        """This container for its worker's job once the worker is done with it (the finishing stage's): a handle
        of its own, as the worker's book and cancel are its next job's (Left). None where a step cannot run without
        its worker (a Slurm node's)."""
        return Left(self)

    def _next_step(self, workdir: Path) -> int:
        key = str(workdir)
        self._steps[key] = self._steps.get(key, 0) + 1
        return self._steps[key]

    def end_job(self, ended: Path | None) -> None:
        """The job using this container is done with it: the next job (or attempt) numbers its steps from 1."""
        self._steps.clear()

    def launch(self, files: detached.Files, argv: Sequence[str], timeout_s: int, env: dict[str, str] | None) -> None:
        """Start a step detached and return at once (a Slurm node's agent: the daemon follows its files on the share)."""
        ctr = self.ensure()
        with self._reach(f"starting {shlex.join(argv[:3])}"):
            self._launch(ctr, files, argv, timeout_s, env)

    def _launch(self, ctr: ContainerRef, files: detached.Files, argv: Sequence[str], timeout_s: int,
               env: dict[str, str] | None) -> None:
        """Create the wrapper's exec, record its id beside the step's files, start it detached."""
        files.base.parent.mkdir(parents=True, exist_ok=True)
        wrapped = ["sh", "-c", f'mkdir -p "${{0%/*}}"; {detached.WRAP}', str(files.base), str(files.work / PIDFILE),
                   TIMEOUT_BIN, f"--kill-after={KILL_AFTER}", f"{max(1, int(timeout_s))}s", *argv]
        api = self.docker.api
        exec_id = str(api.exec_create(ctr.id, wrapped, user=exec_user(self.spec.user), workdir=str(files.work),
                                      environment=env)["Id"])
        files.book.launched(files.work, files.n, exec_id)  # before it starts: a step is never started unrecorded
        api.exec_start(exec_id, detach=True)

    def _lost(self, ctr: ContainerRef, code: int) -> bool:
        """Did the container die under the step? A kill shows as 137 before the engine marks it exited.

        An exit below 128 is the step's own: a dying container kills it by signal, so no engine call is needed.
        """
        if code < 128:
            return False
        try:
            self.docker.api.wait(ctr.id, timeout=LOST_GRACE_S)  # returns as soon as the container stops
        except Exception:  # still running after the grace period (the step alone was killed, e.g. timeout), or
            # gone, or the engine did not answer (whatever requests made of a cut answer): asked once more, as an engine
            # call (unanswered: DOCKER_UNAVAILABLE, the attempt waits for its engine; a dead engine is not a dead
            # container)
            with self._reach(f"asking whether {self.spec.name} still runs"):
                try:
                    return self.docker.containers.get(self.spec.name).status != "running"
                except NotFound:
                    return True
        return True

    def interrupt(self, workdir: Path, reason: str, later: bool = False) -> None:
        """Kill the running step of the job in `workdir` (a cancel), or of one of its variants (a sweep's, each in a
        folder of its own under it), and keep its later steps from running (the stop file stays until the work folder
        is removed); run_step raises CANCELLED by the worker's own reason. `later`: its later steps may still run
        (a step given up on, not the job): the stop file is removed once the kill has run."""
        with contextlib.suppress(OSError):  # no work folder yet: the worker's own flag stops the job before its first step
            filesmod.write_in(workdir, STOPFILE, reason.encode())
        try:
            ctr = self.docker.containers.get(self.spec.name)
            self._exec(ctr, ["sh", "-c", _KILL, *[str(f / PIDFILE) for f in folders(workdir)]], "/", None,
                       lambda _: None)
        except ENGINE_ERRORS:
            pass
        if later:
            with contextlib.suppress(OSError):
                filesmod.remove_in(workdir, STOPFILE)

    def reap(self, workdirs: Sequence[Path]) -> None:
        """Kill the steps of these attempts' work dirs by their pidfiles (attempts requeued elsewhere, or ended by a
        crash limit) and remove those dirs there: nothing else in the container is touched."""
        if not workdirs:
            return
        with self._reach(f"killing leftover steps in {self.spec.name}"):
            try:
                ctr = self.docker.containers.get(self.spec.name)
            except NotFound:
                return
            if ctr.status == "running":  # (each folder is removed after its pidfile is read: the variants' first)
                self._exec(ctr, ["sh", "-c", _REAP, *[str(f / PIDFILE) for w in workdirs for f in folders(w)]], "/",
                           None, lambda _: None)


class Left(Container):
    """A container handle for a job's calls after its worker let go of the container (Container.beside), while that
    worker's next job runs there. It never creates, starts or recreates the container (whoever holds the host lock
    does): one that is gone, stopped, or on another image than the one the job's steps ran on is lost to the call
    (CONTAINER_LOST)."""

    def __init__(self, left: Container) -> None:
        super().__init__(left.docker, left.spec, left.on_event)
        self._probed = dict(left._probed)  # the entry points found, not probed again
        self.image_id = left.image_id

    def ensure(self) -> ContainerRef:
        with self._reach(f"finding container {self.spec.name}"):
            try:
                ctr = self.docker.containers.get(self.spec.name)
            except NotFound:
                raise SaigeError("CONTAINER_LOST", f"container {self.spec.name} is gone") from None
        image = image_of(ctr)
        moved = bool(self.image_id) and image != self.image_id
        if ctr.status != "running" or moved:
            raise SaigeError("CONTAINER_LOST", f"container {self.spec.name} is {ctr.status}"
                             + (f" on another image ({image})" if moved else "") + " since the job's steps ran")
        return ctr
