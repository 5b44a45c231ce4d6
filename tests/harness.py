"""The daemon as a subprocess, a real sd_notify socket, and waits on status files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

POLL_S = 0.05


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, seen: Callable[[], str] | None = None) -> Any:
    """Poll a condition (files on disk change without an event we can subscribe to) until true or timeout; `seen`
    says what there was instead, in the timeout's message."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f": {seen()}" if seen else ""))


def read_status(outbox: Path, job_id: str) -> dict[str, Any] | None:
    """A job's status file, or None while it is absent or being replaced."""
    try:
        doc: dict[str, Any] = json.loads((outbox / "status" / f"{job_id}.json").read_text())
        return doc
    except (OSError, ValueError):
        return None


class EventLog:
    """The JSON events a daemon writes to its stderr file (other lines skipped). The file only grows, so each read
    parses just the lines added since the last one: tests poll it every 50 ms, and a burst's log is long."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._parsed: list[dict[str, Any]] = []
        self._parsed_to, self._unfinished = 0, b""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The events so far (copies), `name`'s only if given."""
        with self._lock:
            try:
                with self.path.open("rb") as fh:
                    fh.seek(self._parsed_to)
                    chunk = fh.read()
            except FileNotFoundError:
                chunk = b""
            self._parsed_to += len(chunk)
            *lines, self._unfinished = (self._unfinished + chunk).split(b"\n")  # the last line may be half written
            for line in lines:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    self._parsed.append(doc)
            return [dict(doc) for doc in self._parsed if name is None or doc.get("event") == name]


class Daemon:
    """`saigeedged run` in a subprocess, with NOTIFY_SOCKET bound to a socket this object reads."""

    def __init__(self, config: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        data = yaml.safe_load(config.read_text())
        self.outbox = Path(data["outbox"])
        self.inbox = Path(data["inbox"])
        self.state_dir = Path(data["state_dir"])
        self.stderr_path = config.parent / f"daemon-{time.monotonic_ns()}.err"
        self._events = EventLog(self.stderr_path)
        self.sock_path = config.parent / f"notify-{time.monotonic_ns()}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.sock_path))
        self.messages: list[str] = []
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.env = dict(os.environ, NOTIFY_SOCKET=str(self.sock_path), **(env or {}))
        self.env.pop("JOURNAL_STREAM", None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.prefix: list[str] = []  # a command the daemon runs under, e.g. ["prlimit", "--as=6000000000"]

    def start(self, ready_timeout: float = 30) -> Daemon:
        after = len(self.messages)  # this start's READY=1, not the one of a daemon started before
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "saigeedged", "run", "-c", str(self.config)],
                                         stdout=subprocess.DEVNULL, stderr=err, env=self.env)
        self.expect("READY=1", ready_timeout, after=after)
        return self

    def launch(self, ready_timeout: float = 30) -> int | None:
        """Start it: None once it says READY=1, else its exit code if it exits first (a refusal to start)."""
        after = len(self.messages)
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "saigeedged", "run", "-c", str(self.config)],
                                         stdout=subprocess.DEVNULL, stderr=err, env=self.env)
        proc = self.proc
        with self._arrived:  # an exit sends no datagram: the wait wakes every POLL_S to look
            deadline = time.monotonic() + ready_timeout
            while time.monotonic() < deadline:
                if any("READY=1" in m for m in self.messages[after:]):
                    return None
                if proc.poll() is not None:
                    return proc.returncode
                self._arrived.wait(POLL_S)
        raise AssertionError(f"neither READY=1 nor an exit in {ready_timeout}s\n{self.stderr()[-3000:]}")

    def _read(self) -> None:
        """Drain the socket like systemd does, so the daemon never finds it full."""
        while True:
            try:
                message = self.sock.recv(4096).decode()
            except OSError:
                return
            with self._arrived:
                self.messages.append(message)
                self._arrived.notify_all()

    def expect(self, text: str, timeout: float, after: int = 0) -> str:
        """Wait for a notify datagram containing `text` (among those from index `after` on)."""
        def found() -> str | None:
            return next((m for m in self.messages[after:] if text in m), None)

        with self._arrived:
            if self._arrived.wait_for(found, timeout):
                return found() or ""
        raise AssertionError(f"no notify message with {text!r} in {timeout}s; got {self.messages[-5:]}\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return self._events.events(name)

    def statuses(self) -> list[dict[str, Any]]:
        folder = self.outbox / "status"
        docs = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                docs.append(json.loads(path.read_text()))
            except (OSError, ValueError):  # replaced between glob and read
                continue
        return docs

    def status(self, job_id: str) -> dict[str, Any] | None:
        return read_status(self.outbox, job_id)

    def wait_job(self, name: str, states: tuple[str, ...] = ("succeeded", "failed", "cancelled"),
                 timeout: float = 60) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            return next((d for d in self.statuses() if d["name"] == name and d["state"] in states), None)

        return wait_for(find, timeout, f"job {name} in {states}\n{self.stderr()[-3000:]}")  # type: ignore[no-any-return]

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 60,
                   step: str | None = None) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            doc = self.status(job_id)
            ok = doc is not None and doc["state"] in states and (step is None or doc["step"] == step)
            return doc if ok else None

        return wait_for(check, timeout, f"{job_id} in {states} step {step}")  # type: ignore[no-any-return]

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        if self.sock.fileno() != -1:  # closing twice (test and fixture teardown) is fine
            self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        self.sock_path.unlink(missing_ok=True)


def drop(folder: Path, stem: str, onnx_src: Path, manifest: dict[str, Any] | str) -> None:
    """A hand drop as a careful writer does it: ONNX first, manifest last (a document, or its text as is), each
    renamed into place."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{stem}.onnx.part"
    tmp.write_bytes(onnx_src.read_bytes())
    tmp.rename(folder / f"{stem}.onnx")
    tmp = folder / f"{stem}.yml.tmp"
    tmp.write_text(manifest if isinstance(manifest, str) else yaml.safe_dump(manifest))
    tmp.rename(folder / f"{stem}.yml")


def job_named(outbox: Path, name: str, states: tuple[str, ...], steps: tuple[str, ...], timeout: float,
              context: Callable[[], str] = lambda: "") -> dict[str, Any]:
    """The status document of job `name` once it is in one of `states` (and at one of `steps`, if given); `context`
    is added to the timeout's message (e.g. the journal of a box)."""
    def find() -> dict[str, Any] | None:
        for path in (outbox / "status").glob(f"{name}-*.json"):
            doc = read_status(outbox, path.stem)
            if doc and doc["name"] == name and doc["state"] in states and (not steps or doc["step"] in steps):
                return doc
        return None

    return wait_for(find, timeout, f"job {name} in {states} {steps}\n" + context())  # type: ignore[no-any-return]


def drop_detector(inbox: Path, data: Path, name: str, **fields: Any) -> None:
    """Drop a small YOLOX detector calibrated on `data`/val.json; its weights are seeded by the name, as an identical
    model would be served from the cache and skip the stand-in's name-chosen behaviour (slow*, hang...)."""
    from factory import yolox

    size = fields.pop("size", (64, 64))
    manifest = {"task": "detection", "num_classes": 3, "calib": str(data / "val.json"), "n_samples": 4, **fields}
    drop(inbox, name, yolox(data / f"{name}.onnx", size=size, seed=zlib.crc32(name.encode())), manifest)


def remove_containers(client: Any, *names: str) -> None:
    """Remove these containers of the engine if they exist (a fixture's clean-up: never created, or already gone)."""
    for name in names:
        try:
            client.containers.get(name).remove(force=True)
        except Exception:  # not there: nothing to remove
            continue


LOST_OUTPUT_TRIES = 5


def answered(ask: Callable[[], tuple[int, str]]) -> tuple[int, str]:
    """(exit code, output) of an exec that prints when it succeeds, asked again when the engine hands back exit 0 with
    no output: a busy engine sometimes loses a short exec's output (docker-py #2042, moby #27289)."""
    for _ in range(LOST_OUTPUT_TRIES):
        code, out = ask()
        if out or code != 0:
            break
    return code, out


STANDIN_RELEASE = "/tmp/standin-release"  # in its container, ends the stand-in's `untilreleased` quantize
STANDIN_QUANTIZE = "pegasus.py quantize"  # among a container's processes while the stand-in's quantize runs


def release_standin(ctr: Any, released: bool = True) -> None:
    """End the stand-in's `untilreleased` quantize in this container (docker-py's), straight through the engine (never
    a test's EngineProxy); `released=False` takes the release back, for a container later tests share."""
    ctr.exec_run(["touch", STANDIN_RELEASE] if released else ["rm", "-f", STANDIN_RELEASE])


def wait_for_quantize(ctr: Any) -> None:
    """Until the stand-in's quantize runs in this container (docker-py's): a status says `quantize` before the step's
    exec has started."""
    wait_for(lambda: STANDIN_QUANTIZE in container_output(ctr, ["ps", "-o", "args"]), 30, "the stand-in's quantize step")


def reported_beside(d: Any, method: str, names: tuple[str, str] = ("first", "second")) -> list[dict[str, Any]]:
    """Both jobs of daemon `d` succeed with their reports (`method`), published, and the second starts after the first
    was handed to the finishing stage and before the first ends: its compile did not wait for that report."""
    done = [d.wait_job(name, timeout=180) for name in names]
    assert [j["state"] for j in done] == ["succeeded", "succeeded"], done
    assert all(j["accuracy"]["method"] == method and (d.outbox / j["bundle"]["path"]).is_file() for j in done)
    order = [(e["event"], e["job_name"]) for e in d.events() if e.get("event") in ("job.started", "job.succeeded",
                                                                                   "job.finishing")]
    first, second = names
    assert order.index(("job.finishing", first)) < order.index(("job.started", second)) \
        < order.index(("job.succeeded", first)), order
    return done


def container_output(ctr: Any, argv: list[str]) -> str:
    """The output of `argv` in a container (e.g. `ps`, or `cat` of a record): never empty when it succeeds."""
    def ask() -> tuple[int, str]:
        result = ctr.exec_run(argv)
        return int(result.exit_code), str(result.output.decode())

    return answered(ask)[1]
