"""The dashboard (SPEC §13): <outbox>/index.html kept current by the daemon, read by headless Chromium from file://."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from conftest import write_config
from harness import drop, wait_for
from test_daemon_docker import cubie_daemon, in_quantize  # noqa: F401 (a fixture)

from saigeedged import config, jobid
from saigeedged.adapters import dashboard
from saigeedged.adapters.store import Store
from saigeedged.cli import main as cli
from saigeedged.jobs import CANCELLED, FAILED, Job
from saigeedged.service.ops import Ops

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by scripts/setup-host")


class Rows(HTMLParser):
    """Each `<tr id=JOB_ID>`: its cells' text (by data-label) and its links; plus the page's whole text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self.links: dict[str, dict[str, str]] = {}
        self.text: list[str] = []
        self._row: str | None = None
        self._cell = ""
        self._anchor = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("id"):
            self._row = a["id"]
            self.rows[self._row], self.links[self._row] = {}, {}
        elif tag == "td" and self._row:
            self._cell = a.get("data-label") or ""
        elif tag == "a" and self._row:
            self._anchor, self._href = True, a.get("href") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        self._anchor = self._anchor and tag != "a"

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._row and self._cell:
            cells = self.rows[self._row]
            cells[self._cell] = (cells.get(self._cell, "") + " " + data).strip()
        if self._row and self._anchor:
            self.links[self._row][data] = self._href


def chromium(*args: str) -> str:
    assert CHROMIUM is not None
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *args], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.mark.docker
@needs_chromium
def test_page_in_chromium_shows_every_job(cubie_daemon: Any, docker_client: Any, tmp_path: Path,  # noqa: F811
                                          det_inputs: dict[str, Any]) -> None:
    """Running, queued, failed and succeeded jobs appear with state, step, error code, hint, report and working links."""
    d = cubie_daemon(dashboard=True)
    host = {**det_inputs["manifest"], "target": "host"}
    drop(d.inbox, "good", det_inputs["onnx"], host)
    good = d.wait_job("good")
    drop(d.inbox, "bad", det_inputs["onnx"], {**host, "num_classes": 7})
    bad = d.wait_job("bad")
    hang = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
    drop(d.inbox, "waiting", det_inputs["onnx"], det_inputs["manifest"])  # a cubie job: queued behind the hang
    waiting = d.wait_job("waiting", ("queued",))
    page = d.outbox / "index.html"
    wait_for(lambda: waiting["job_id"] in page.read_text(), 30, "the queued job on the page")
    dom = Rows()
    dom.feed(chromium("--dump-dom", page.as_uri()))
    rows = dom.rows
    assert rows[good["job_id"]]["state"] == "succeeded" and rows[good["job_id"]]["quantization"].startswith("ok")
    assert rows[bad["job_id"]]["state"] == "failed" and rows[bad["job_id"]]["error"].startswith("CALIB_INVALID")
    assert rows[bad["job_id"]]["hint"] == bad["error"]["hint"]
    assert rows[hang["job_id"]]["state"] == "running" and rows[hang["job_id"]]["step"] == "quantize 8/11"
    assert rows[waiting["job_id"]]["state"] == "queued"
    links = dom.links[good["job_id"]]
    assert unquote(links["bundle"]) == good["bundle"]["path"]
    assert all((d.outbox / unquote(links[k])).is_file() for k in ("bundle", "log", "status"))
    assert "1 running, 1 queued" in "".join(dom.text)
    for width in (420, 1100):  # a phone and a desktop (docs/dashboard.png is the desktop one of such a run)
        shot = tmp_path / f"dashboard-{width}.png"
        chromium(f"--screenshot={shot}", f"--window-size={width},900", "--hide-scrollbars", page.as_uri())
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for job in (hang, waiting):
        assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0


def test_page_escapes_names_and_is_rewritten_at_most_once_a_second(tmp_path: Path) -> None:
    """A hostile drop name is shown as text; changes within a second wait for the next second's rewrite."""
    store = Store(tmp_path / "state" / "saigeedged.db")
    cfg = config.load(write_config(tmp_path, dashboard=True))
    ops = Ops(cfg, store, clock=lambda: 0.0)
    now = jobid.iso(jobid.utc_now())
    job = Job(job_id="x-1", name='<img src=x onerror="alert(1)">', target="host", task="mlc", entry={"onnx": "a.onnx"},
              subdir="", claim_dir=str(tmp_path), manifest="m.yml", state=FAILED, created_at=now, finished_at=now,
              error={"code": "MANIFEST_INVALID", "message": "<b>bad</b>", "hint": "fix it", "step": "validate"})
    store.add(job)
    ops.observe(job)
    page = dashboard.page_path(cfg.outbox)
    ops.tick(100.0)
    first = page.read_text()
    assert "<img" not in first and "&lt;img src=x" in first and "&lt;b&gt;bad&lt;/b&gt;" in first
    page.unlink()
    ops.observe(job)
    ops.tick(100.5)
    assert not page.exists()  # within the second: not yet
    ops.tick(101.0)
    assert page.exists()  # the pending change is written at the next second


def test_a_queued_job_cancelled_from_a_shell_leaves_the_page_at_the_next_second(tmp_path: Path) -> None:
    """`saigeedged cancel` of a queued job is written by the shell's own connection, which the daemon's observers never
    see: the page is rewritten at the next second (it listed the job as queued until the 30 s rewrite)."""
    store = Store(tmp_path / "state" / "saigeedged.db")
    cfg = config.load(write_config(tmp_path, dashboard=True))
    ops = Ops(cfg, store, clock=lambda: 0.0)
    job = queued_job(1, jobid.iso(jobid.utc_now()))
    store.add(job)
    ops.observe(job)
    ops.tick(100.0)
    page = dashboard.page_path(cfg.outbox)
    assert "1 queued" in page.read_text()
    shell = Store(tmp_path / "state" / "saigeedged.db")  # the CLI's cancel of a queued job: its own connection
    job.state, job.finished_at = CANCELLED, jobid.iso(jobid.utc_now())
    shell.save(job)
    shell.close()
    ops.tick(101.0)
    assert "0 queued" in page.read_text()


def queued_job(i: int, now: str) -> Job:
    return Job(job_id=f"q{i:05d}-1", name=f"model{i}", target="host", task="mlc", entry={"onnx": "a.onnx"}, subdir="",
               claim_dir="/c", manifest="m.yml", state="queued", created_at=now)


def test_a_long_queue_shows_its_head_and_counts_the_rest(tmp_path: Path) -> None:
    """10,000 queued jobs: the page lists the head of the queue and says how many more wait, so it stays small;
    the daemon reads only that head from the queue."""
    now = jobid.iso(jobid.utc_now())
    jobs = [queued_job(i, now) for i in range(10_000)]
    page = dashboard.render(dashboard.View(now, [], [], jobs, []))
    assert len(page) < 200_000 and "10000 queued" in page
    assert "q00000-1" in page and f"q{dashboard.QUEUE_SHOWN:05d}-1" not in page
    assert f"and {10_000 - dashboard.QUEUE_SHOWN} more queued" in page
    store = Store(tmp_path / "state" / "saigeedged.db")
    for job in jobs[:dashboard.QUEUE_SHOWN + 5]:
        store.add(job)
    view = Ops(config.load(write_config(tmp_path, dashboard=True)), store).view()
    assert len(view.queued) == dashboard.QUEUE_SHOWN and view.waiting == dashboard.QUEUE_SHOWN + 5


@needs_chromium
def test_a_page_the_daemon_stopped_rewriting_says_so(tmp_path: Path) -> None:
    """A page last written long ago (daemon stopped or crashed) shows a stale notice in the browser; a fresh one
    does not."""
    def stale_shown(now: str) -> bool:
        page = tmp_path / "index.html"
        page.write_text(dashboard.render(dashboard.View(now, [], [], [], [])))
        dom = chromium("--dump-dom", page.as_uri())
        head = dom.split('id="stale"', 1)[1].split(">", 1)[0]
        return "hidden" not in head

    assert stale_shown("2026-01-01T00:00:00.000Z")
    assert not stale_shown(jobid.iso(jobid.utc_now()))


def test_a_report_with_thousands_of_outputs_shows_the_worst_few(tmp_path: Path) -> None:
    """200 jobs whose models have 5,000 outputs each (long names) still make a small page: each report lists its
    worst outputs first and counts the rest."""
    now = jobid.iso(jobid.utc_now())
    outputs = {f"out{i:04d}_{'x' * 500}": {"cosine": 0.999 - i / 1e6, "max_abs_error": 0.1, "flagged": False}
               for i in range(5000)}
    report = {"images": 4, "threshold": 0.99, "outputs": outputs, "flagged": []}
    jobs = [Job(job_id=f"r{i:03d}-1", name="many", target="host", task="mlc", entry={"onnx": "a.onnx"}, subdir="",
                claim_dir="/c", manifest="m.yml", state="succeeded", created_at=now, finished_at=now, report=report)
            for i in range(dashboard.RECENT)]
    page = dashboard.render(dashboard.View(now, [], [], [], jobs))
    assert len(page) < 2_000_000 and "and 4990 more outputs" in page
    first = page.index("out4999_")
    assert first < page.index("out4990_") and "out4989_" not in page  # the lowest cosine first
