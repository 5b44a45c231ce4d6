"""The dashboard (SPEC §13): <outbox>/index.html, one static self-contained page rendered from the queue.

No server and no external asset: it is read from `file://` on the share, refreshes itself with a meta refresh
and links to bundles, logs and status files by paths relative to the outbox.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from saigeedged import __version__, accuracytable
from saigeedged.errors import HINTS
from saigeedged.jobs import Job

RECENT = 200
QUEUE_SHOWN = 100  # the head of a long queue: 10,000 rows would make a page of megabytes, rewritten every second
REFRESH_S = 5
REPORT_LINES = 10  # per job, its worst outputs: a model may have thousands (the status file keeps them all)
NAME_CHARS = 80  # an output name longer than this is cut on the page
STALE_S = 120  # the daemon rewrites the page at least every 30 s; older than this, the page says it is stale
STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;padding:8px 12px;max-width:1200px;color:#222;background:#fff}
h1{font-size:1.3em;margin:.3em 0}h2{font-size:1.1em;margin:1.2em 0 .4em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 6px;border-bottom:1px solid #eee;
vertical-align:top}th{background:#f4f4f4}.muted{color:#666;font-size:.9em}.id{font-family:monospace;font-size:.85em}
.state{font-weight:bold}.when{white-space:nowrap}.id{word-break:break-all}table.jobs td:first-child{min-width:15em}
.succeeded{color:#176b1f}.failed{color:#b00020}.cancelled{color:#666}.running{color:#0645ad}
.queued{color:#8a5a00}.down{color:#b00020;font-weight:bold}.up{color:#176b1f}.flag{color:#b00020;font-weight:bold}
@media (max-width:700px){table.jobs thead{display:none}table.jobs tr{display:block;border-bottom:2px solid #ccc;
padding:4px 0}table.jobs td{display:block;border:0;padding:1px 4px}table.jobs td[data-label]::before{
content:attr(data-label) ": ";color:#666}table.jobs td:empty{display:none}}
"""


@dataclass(frozen=True)
class Slot:
    """Where one job at a time runs: a target's container on an engine (host jobs: the daemon's own CPU)."""

    engine: str
    target: str
    up: bool
    job: Job | None


@dataclass(frozen=True)
class View:
    """Everything the page shows; `now` is the UTC ISO time it was made."""

    now: str
    slots: list[Slot]
    running: list[Job]
    queued: list[Job]  # the head of the queue (at most QUEUE_SHOWN are shown)
    recent: list[Job]
    queued_total: int | None = None  # the whole queue's length, when `queued` is only its head

    @property
    def waiting(self) -> int:
        return len(self.queued) if self.queued_total is None else max(self.queued_total, len(self.queued))


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _link(href: str, text: str) -> str:
    return f'<a href="{escape(quote(href))}">{_e(text)}</a>'


def _when(stamp: str | None) -> str:
    """`2026-11-30T03:15:00.123Z` → `2026-11-30 03:15:00Z`, kept on one line."""
    return f'<span class="when">{_e(stamp[:19].replace("T", " ") + "Z")}</span>' if stamp else ""


def _step(job: Job) -> str:
    return f"{_e(job.step)} {job.step_index}/{job.step_count}" if job.step else "starting"


def _slots(slots: list[Slot]) -> str:
    rows = [f'<tr><td>{_e(s.engine)}</td><td>{_e(s.target)}</td><td class="{"up" if s.up else "down"}">'
            f'{"up" if s.up else "down"}</td><td>'
            + (f'{_e(s.job.name)} <span class="muted">{_step(s.job)}</span>' if s.job else '<span class="muted">idle</span>')
            + "</td></tr>" for s in slots]
    return ('<table><thead><tr><th>engine</th><th>slot</th><th>engine state</th><th>job</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def _queue(view: View) -> str:
    shown = view.queued[:QUEUE_SHOWN]
    more = view.waiting - len(shown)
    tail = f'<p class="muted">and {more} more queued (the first {len(shown)} in queue order are shown)</p>' if more else ""
    return _active(shown, False) + tail


def _stale(view: View) -> str:
    """A notice the browser shows when the page is older than STALE_S: a stopped daemon cannot say so itself."""
    made = json.dumps(view.now).replace("<", "\\u003c")  # a JS string that cannot end the script element
    script = (f"(function(){{if(Date.now()-Date.parse({made})>{STALE_S * 1000})"
              "{document.getElementById('stale').hidden=false;}})();")
    return (f'<p id="stale" class="down" hidden>This page has not been updated since {_e(view.now)}: the daemon may be '
            f'stopped or unable to write the outbox (check <code>systemctl status saigeedged</code>).</p>'
            f'<script>{script}</script>')


def _active(jobs: list[Job], running: bool) -> str:
    if not jobs:
        return f'<p class="muted">{"nothing running" if running else "the queue is empty"}</p>'
    head = "<th>job</th><th>target</th><th>state</th>" + ("<th>step</th><th>started</th>" if running else
                                                           "<th>priority</th><th>queued at</th><th>attempt</th>")
    rows = []
    for job in jobs:
        cells = [_name(job), f'<td data-label="target">{_e(job.target)}</td>', _state(job)]
        if running:
            cells += [f'<td data-label="step">{_step(job)}</td>', f'<td data-label="started">{_when(job.started_at)}</td>']
        else:
            cells += [f'<td data-label="priority">{job.priority}</td>', f'<td data-label="queued">{_when(job.created_at)}</td>',
                      f'<td data-label="attempt">{job.attempt}</td>']
        rows.append(f'<tr id="{_e(job.job_id)}">' + "".join(cells) + "</tr>")
    return f'<table class="jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _name(job: Job) -> str:
    return f'<td data-label="job"><b>{_e(job.name)}</b><br><span class="id">{_e(job.job_id)}</span></td>'


def _state(job: Job) -> str:
    return f'<td data-label="state" class="state {_e(job.state)}">{_e(job.state)}</td>'


def _error(job: Job) -> str:
    if not job.error:
        return '<td data-label="error"></td><td data-label="hint"></td>'
    message = str(job.error.get("message") or "").splitlines()[:1]
    hint = job.error.get("hint") or HINTS.get(job.error["code"], "")
    return (f'<td data-label="error"><b>{_e(job.error.get("code"))}</b><br>'
            f'<span class="muted">{_e(message[0] if message else "")}</span></td><td data-label="hint">{_e(hint)}</td>')


def _report(report: dict[str, Any] | None) -> str:
    """The float-vs-compiled comparison: the worst REPORT_LINES outputs, flagged ones marked."""
    if not report or not report.get("outputs"):
        return '<td data-label="quantization"></td>'
    # a cosine that was not a finite number is null (accuracytable.nulled): worst of all
    outputs = sorted(report["outputs"].items(), key=lambda item: float(item[1].get("cosine") or -2.0))
    lines = []
    for name, row in outputs[:REPORT_LINES]:
        mark = ' <span class="flag">FLAGGED</span>' if row.get("flagged") else ""
        shown = name if len(name) <= NAME_CHARS else f"{name[:NAME_CHARS]}…"
        lines.append(f'{_e(shown)}: cosine {_e(row.get("cosine"))}, max abs error {_e(row.get("max_abs_error"))}{mark}')
    if len(outputs) > REPORT_LINES:
        lines.append(f"and {len(outputs) - REPORT_LINES} more outputs (every one is in the status file)")
    worst = outputs[0][1].get("cosine")
    summary = (f'{len(report["flagged"])} flagged' if report.get("flagged") else "ok") + \
        (f", cosine ≥ {float(worst):.4f}" if worst is not None else ", cosine NaN/inf")
    css = ' class="flag"' if report.get("flagged") else ""
    return (f'<td data-label="quantization"><details><summary{css}>{summary}</summary>'
            f'{"<br>".join(lines)}</details></td>')


def _accuracy(job: Job) -> str:
    """The accuracy report (SPEC §17): the worst cosine and the gate's verdict, the whole table when opened."""
    if not job.accuracy:
        return '<td data-label="accuracy"></td>'
    gate = job.accuracy.get("gate") or {}
    worst = accuracytable.worst_cosine(job.accuracy)
    verdict = "gate passed" if gate.get("passed") else "BELOW THE GATE"
    css = "" if gate.get("passed") else ' class="flag"'
    summary = f"{verdict}, cosine ≥ {worst:.4f}" if worst is not None else verdict
    return (f'<td data-label="accuracy"><details><summary{css}>{_e(summary)}</summary>'
            f'{"<br>".join(_e(line) for line in accuracytable.table(job.accuracy))}</details></td>')


def _links(job: Job) -> str:
    if job.pruned_at:  # its files are gone, and its bundle's path may be another job's by now
        return f'<td data-label="files"><span class="muted">pruned {_when(job.pruned_at)}</span></td>'
    links = [_link(job.bundle["path"], "bundle")] if job.bundle else []
    links += [_link(f"logs/{job.job_id}.log", "log"), _link(f"status/{job.job_id}.json", "status")]
    return f'<td data-label="files">{" · ".join(links)}</td>'


def _recent(jobs: list[Job]) -> str:
    if not jobs:
        return '<p class="muted">no job has ended yet</p>'
    rows = [f'<tr id="{_e(j.job_id)}">{_name(j)}<td data-label="target">{_e(j.target)}</td>{_state(j)}'
            f'<td data-label="ended">{_when(j.finished_at)}</td>{_error(j)}{_report(j.report)}{_accuracy(j)}{_links(j)}</tr>'
            for j in jobs]
    head = "".join(f"<th>{h}</th>" for h in ("job", "target", "state", "ended", "error", "hint", "quantization",
                                              "accuracy", "files"))
    return f'<table class="jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def render(view: View) -> str:
    """The whole page (pure)."""
    title = f"saigeedged on {socket.gethostname()}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta http-equiv="refresh" content="{REFRESH_S}"><title>{_e(title)}</title><style>{STYLE}</style></head>'
            f'<body><h1>{_e(title)}</h1>{_stale(view)}<p class="muted">updated {_e(view.now)} · saigeedged {__version__} · '
            f'{len(view.running)} running, {view.waiting} queued · this page reloads every {REFRESH_S} s</p>'
            f'<h2>Engines and slots</h2>{_slots(view.slots)}'
            f'<h2>Running</h2>{_active(view.running, True)}'
            f'<h2>Queue</h2>{_queue(view)}'
            f'<h2>Last {RECENT} jobs</h2>{_recent(view.recent)}</body></html>\n')


def page_path(outbox: Path) -> Path:
    return outbox / "index.html"
