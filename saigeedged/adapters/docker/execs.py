"""Steps exec'd in a compiler container: wrapped in `timeout`, streamed, killed by pidfile, reaped after a crash."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from saigeedged.adapters.docker.api import ENGINE_ERRORS, ContainerRef, DockerAPI, NotFound
from saigeedged.adapters.docker.lifecycle import Lifecycle, OnEvent
from saigeedged.adapters.docker.spec import Spec, exec_user
from saigeedged.adapters.docker.transfer import LIST_FORMAT, Trailer, WorkSync, owner_ids
from saigeedged.errors import SaigeError

KILL_AFTER = "30s"
LOST_GRACE_S = 2  # how long a step killed by a signal waits to see whether its whole container is going down
PIDFILE = ".step.pid"
STOPFILE = ".step.stop"  # beside the pidfile: a stop or cancel for this job's steps, holding its reason
# by path: a busybox sh would run its own applet for a bare `timeout` (coreutils lives here on Ubuntu)
TIMEOUT_BIN = "/usr/bin/timeout"
# writes the step's pid (GNU timeout, the head of its process group), then runs it unless a stop came first:
# interrupt() writes the stop file before it reads the pidfile, so either this sees the stop or the kill sees the pid
_WRAP = 'echo $$ > "$0"; [ -e "${0%.pid}.stop" ] && exit 143; exec "$@"'
# on a remote engine the wrapper also lists the work dir when the step ends, on stderr (the step's own output goes to
# stdout): the host learns what to copy back, and the exit code, without another exec. The step runs in an inner sh
# that adds its pid (timeout's) to the pidfile, after the wrapper's own (the head of the exec's process group): the
# kill reaches both groups, whichever timeout (GNU's own group or not) the image has. END <code> ends a whole listing.
_WRAP_LIST = 'echo $$ > "$0"; sh -c \'echo $$ >> "$0"; [ -e "${0%.pid}.stop" ] && exit 143; exec "$@"\' "$0" "$@" ' \
             '2>&1 </dev/null & wait $!; c=$?; ' \
             'find "${0%/*}" -type f -exec stat -c "' + LIST_FORMAT + '" {} + >&2 2>/dev/null; ' \
             'echo "END $c" >&2; exit $c'
# the stop file is touched inside the container too: on a remote engine the host's copy is not seen there
_KILL = 'touch "${0%.pid}.stop" 2>/dev/null; for p in $(cat "$0" 2>/dev/null); do ' \
        'kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; done; rm -f "$0"'
_REAP = 'for f in "$0"/*/' + PIDFILE + ' "$0"/*/*/' + PIDFILE + '; do [ -f "$f" ] || continue; for p in $(cat "$f"); ' \
        'do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done; rm -f "$f"; done; true'
Sink = Callable[[bytes], None]


class Container(Lifecycle):
    """A compiler container and the steps run in it; on a remote engine the work dir is copied in and out."""

    def __init__(self, api: DockerAPI, spec: Spec, on_event: OnEvent) -> None:
        super().__init__(api, spec, on_event)
        self._sync: WorkSync | None = None  # the work dir of the job in this container (remote engines)
        self.moved = 0  # bytes copied in and out (remote engines), for the job log
        self.probe_failure = ""  # what the last entry-point probe that found nothing said, for the error message

    def _exec(self, ctr: ContainerRef, argv: Sequence[str], workdir: str, env: dict[str, str] | None,
              sink: Sink, trailer: Trailer | None = None) -> int | None:
        """Run argv, its output to `sink` (stderr to `trailer` when given); its exit code, None if it was cut off."""
        api = self.docker.api
        exec_id = str(api.exec_create(ctr.id, list(argv), user=exec_user(self.spec.user), workdir=workdir,
                                      environment=env)["Id"])
        for out, err in api.exec_start(exec_id, stream=True, demux=True):
            if out:
                sink(out)
            if err:
                (sink if trailer is None else trailer.feed)(err)
        if trailer is not None and trailer.code is not None:
            return trailer.code  # the wrapper ran to its end: no exec_inspect round trip
        while True:  # the stream ends on a broken connection too: only exec_inspect decides
            info = api.exec_inspect(exec_id)
            if not info["Running"]:
                code = info.get("ExitCode")
                return None if code is None else int(code)
            time.sleep(0.02)

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
                 env: dict[str, str] | None = None) -> int:
        """One compiler step under `timeout --kill-after`, output streamed to `sink`; returns its exit code."""
        ctr = self.ensure()
        pidfile = str(workdir / PIDFILE)
        trailer = None if self.spec.mount else Trailer()
        wrap = _WRAP if trailer is None else _WRAP_LIST
        wrapped = ["sh", "-c", wrap, pidfile, TIMEOUT_BIN, f"--kill-after={KILL_AFTER}", f"{max(1, int(timeout_s))}s",
                   *argv]
        _raise_if_stopped(workdir, argv)  # a stop that came between steps is not erased by this one
        with self._reach(f"running {shlex.join(argv[:3])}"):
            self._copy_in(ctr, workdir)
            code = self._exec(ctr, wrapped, str(workdir), env, sink, trailer)
        _raise_if_stopped(workdir, argv)
        if code is None or self._lost(ctr, code):
            raise SaigeError("CONTAINER_LOST", f"container {self.spec.name} died during {shlex.join(argv[:3])}")
        with self._reach(f"copying the outputs of {shlex.join(argv[:3])}"):
            self._copy_out(ctr, None if trailer is None else trailer.listing)
        Path(pidfile).unlink(missing_ok=True)
        return code

    def _copy_in(self, ctr: ContainerRef, workdir: Path) -> None:
        if self.spec.mount:
            return
        if self._sync is None or self._sync.work != workdir:
            self._sync, self.moved = WorkSync(workdir, owner_ids(exec_user(self.spec.user))), 0
        self.moved += self._sync.push(self.docker, ctr, lambda argv: self._fixed(ctr, argv))

    def _copy_out(self, ctr: ContainerRef, listing: bytes | None) -> None:
        if self._sync is not None and not self.spec.mount:
            self.moved += self._sync.pull(self.docker, ctr, lambda argv: self._fixed(ctr, argv), listing)

    def _fixed(self, ctr: ContainerRef, argv: list[str]) -> bytes:
        """Run a fixed helper command (no manifest values); its output, or CONTAINER_LOST when it fails."""
        out: list[bytes] = []
        code = self._exec(ctr, argv, "/", None, out.append)
        if code != 0:
            raise SaigeError("CONTAINER_LOST", f"container {self.spec.name}: `{shlex.join(argv[:2])}` exited {code}: "
                             f"{b''.join(out)[-500:].decode(errors='replace')}")
        return b"".join(out)

    def _lost(self, ctr: ContainerRef, code: int) -> bool:
        """Did the container die under the step? A kill shows as 137 before the engine marks it exited.

        An exit below 128 is the step's own: a dying container kills it by signal, so no engine call is needed.
        """
        if code < 128:
            return False
        try:
            self.docker.api.wait(ctr.id, timeout=LOST_GRACE_S)  # returns as soon as the container stops
        except Exception:  # still running after the grace period: the step alone was killed (e.g. timeout)
            return not self.alive()
        return True

    def alive(self) -> bool:
        try:
            return self.docker.containers.get(self.spec.name).status == "running"
        except ENGINE_ERRORS:
            return False

    def interrupt(self, workdir: Path, reason: str) -> None:
        """Kill the running step of the job in `workdir` (cancel or daemon stop); its run_step raises CANCELLED,
        and so does every later step of that job (the stop file stays until the work folder is removed)."""
        try:
            (workdir / STOPFILE).write_text(reason)
        except OSError:  # no work folder yet: the worker's own flag stops the job before its first step
            pass
        try:
            ctr = self.docker.containers.get(self.spec.name)
            self._exec(ctr, ["sh", "-c", _KILL, str(workdir / PIDFILE)], "/", None, lambda _: None)
        except ENGINE_ERRORS:
            pass

    def reap(self) -> None:
        """Kill leftover steps recorded by their pidfiles: of a daemon SIGKILL'd mid-step, or of steps whose
        engine connection was cut (they may have run on while the engine was unreachable)."""
        with self._reach(f"killing leftover steps in {self.spec.name}"):
            try:
                ctr = self.docker.containers.get(self.spec.name)
            except NotFound:
                return
            if ctr.status == "running":
                self._exec(ctr, ["sh", "-c", _REAP, str(self.spec.work_root)], "/", None, lambda _: None)


def _raise_if_stopped(workdir: Path, argv: Sequence[str]) -> None:
    try:
        reason = (workdir / STOPFILE).read_text().strip() or "stop"
    except FileNotFoundError:
        return
    raise SaigeError("CANCELLED", f"step {shlex.join(argv[:3])} was stopped ({reason})", reason=reason)
