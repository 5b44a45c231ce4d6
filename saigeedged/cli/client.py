"""The client commands `submit`, `status`, `retry`, `cancel`, `prune`: they talk to the daemon through the inbox and the queue."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

import yaml

from saigeedged import accuracytable, external, files, safeyaml
from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.cli import owner, partition
from saigeedged.cli.enginestatus import attempt_lines, engine_lines
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.files import sha256_file
from saigeedged.guards import headline, printable
from saigeedged.jobs import CANCELLED, FAILED, QUEUED, RUNNING, TERMINAL, Job, TransitionError, check_transition
from saigeedged.manifest import safe_stem

CLAIM_WAIT_S = 60.0  # `submit` gives up (exit 3) when no daemon claims the drop within this (or --timeout)
WAIT_POLL_S = 0.1  # status files live on a share: reading them is the only cross-host signal


NO_JOB_HINT = "`saigeedged status` lists the jobs (give a job id or a job name); pass the daemon's -c file"


ACTS_ON = {"cancel": (QUEUED, RUNNING), "retry": (FAILED, CANCELLED)}  # the states each command takes a job in


def _by_id(store: Store, job_id: str, command: str) -> Job:
    """The job `retry` or `cancel` acts on: by id only (a name may be many jobs); a name gets the id of its newest job
    the command can act on (a queued job's, for cancel: not the failed drop of that name made since)."""
    job = store.get(job_id)
    if job is not None:
        return job
    newest = store.newest_named(job_id, ACTS_ON[command])
    hint = (f"{command} takes a job id, and `{job_id}` is a job name: its newest job to {command} is {newest.job_id}"
            if newest else "`saigeedged status` lists the jobs and their ids; pass the daemon's -c file")
    raise SaigeError("INPUT_NOT_FOUND", f"no job {job_id}", hint=hint)


def _store(config: Config) -> Store:
    path = config.state_dir / "saigeedged.db"
    if not path.exists():
        raise SaigeError("INPUT_NOT_FOUND", f"no job database at {path}", hint="is the daemon configured with this -c file?")
    if not os.access(path, os.R_OK | os.W_OK):  # (a reader of a WAL database writes its -shm too)
        raise owner.refused(path, os.strerror(errno.EACCES))
    try:
        return Store(path, verify=False)  # the daemon checks the file at its start; a command must not read it whole
    except PermissionError as exc:
        raise owner.refused(exc.filename or path, exc.strerror) from None


def _place(src: Path, dest: Path, data: bytes | None = None) -> None:
    """Write under a temporary (ignored) name, then rename into the inbox."""
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")  # pids of two hosts may meet on a share
    if data is None:
        files.copy_file(src, dest, tmp=tmp)
    else:
        files.write_bytes(dest, data, tmp=tmp)


def _submitted_manifest(manifest: Path, model: Path, request_id: str) -> tuple[str, str, bytes]:
    """(stem, the submission's own file stem, the manifest to drop).

    Each submission gets files of its own, `<stem>.<request id>.onnx`/`.yml` (the manifest's `onnx:` names its own
    model), so parallel submits of one name never overwrite each other; `name: <stem>` keeps the job's name, its
    output and `status NAME` as the user expects.
    """
    try:
        data = safeyaml.load(manifest)  # its bounds and checks (a key given twice), as the daemon reads it
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise SaigeError("MANIFEST_INVALID", f"{manifest.name}: cannot read: {exc}") from None
    if not isinstance(data, dict) or "models" in data:
        raise SaigeError("MANIFEST_INVALID", f"{manifest.name}: submit takes a single-model manifest",
                         hint="drop multi-model manifests into the inbox by hand, or use `saigeedged compile`")
    calib = data.get("calib")
    if isinstance(calib, str) and not Path(calib).is_absolute():
        data["calib"] = str((manifest.parent / calib).resolve())  # the manifest moves; its calib does not
    stem = safe_stem(str(data.get("name") or manifest.stem))
    own = f"{stem}.{request_id[:8]}"
    data.update(name=stem, onnx=f"{own}.onnx", sha256=sha256_file(model), request_id=request_id)
    return stem, own, yaml.safe_dump(data, sort_keys=False).encode()


def _weights(model: Path, folder: Path) -> list[tuple[Path, Path]]:
    """(source, inbox path) of each external-data file the model names: they keep their names (the model points at
    them), so one of another drop still in the inbox would be taken by whichever is claimed first: refused."""
    placed = []
    for location in external.locations(model):
        src = external.beside(model, location)
        if src is None or not src.is_file():
            raise SaigeError("INPUT_NOT_FOUND", f"{model.name} keeps weights in `{printable(location)}`, not a file "
                             "in its folder", hint="save the model with its external data beside it (onnx.save with "
                             "location=<name>), or with the weights inside")
        dest = folder / src.relative_to(model.parent)
        if dest.exists():
            raise SaigeError("INPUT_INCOMPLETE", f"{dest} is in the inbox already (another drop's weights, not claimed "
                             "yet)", hint="submit again once that drop is claimed, or into another --subdir")
        dest.parent.mkdir(parents=True, exist_ok=True)
        placed.append((src, dest))
    return placed


def _find_status(outbox: Outbox, stem: str, own: str, request_id: str) -> dict[str, Any] | None:
    """The status of this submission: the job that carries its request id, or the failed job of its manifest when the
    daemon could not read one from it (a manifest that does not parse is named after its file, `<own>.yml`)."""
    folder = outbox.root / "status"
    if not folder.is_dir():
        return None
    for path in [*folder.glob(f"{stem}-*.json"), *folder.glob(f"{safe_stem(own)}-*.json")]:
        doc = outbox.read_status(path.stem)
        if doc and (doc.get("request_id") == request_id or doc.get("request_id") is None
                    and (doc.get("inputs") or {}).get("manifest") == f"{own}.yml"):
            return doc
    return None


def _check_submitted(args: argparse.Namespace) -> None:
    for path in (args.model, args.manifest):
        if not path.exists():
            raise SaigeError("INPUT_NOT_FOUND", f"{path} not found")
        if not path.is_file():
            raise SaigeError("INPUT_NOT_FOUND", f"{path} is not a regular file", hint="submit copies files: write the "
                             "manifest to a file first (a pipe or a folder cannot be dropped)")
    if ".." in Path(args.subdir).parts or Path(args.subdir).is_absolute():
        raise SaigeError("MANIFEST_INVALID", f"--subdir {args.subdir!r} must be relative to the inbox, without `..`")


def submit(config: Config, args: argparse.Namespace, out: TextIO) -> int:
    """Copy the model, then the manifest (the commit marker) into the inbox; print the job's status path."""
    _check_submitted(args)
    request_id = uuid.uuid4().hex
    stem, own, text = _submitted_manifest(args.manifest, args.model, request_id)
    folder = config.inbox / args.subdir
    folder.mkdir(parents=True, exist_ok=True)
    for src, dest in _weights(args.model, folder):  # first: the claim takes them with the model, as a hand drop's
        _place(src, dest)
    _place(args.model, folder / f"{own}.onnx")
    _place(args.manifest, folder / f"{own}.yml", text)
    outbox = Outbox(config.outbox)
    start = time.monotonic()
    # a compile takes minutes: without --timeout only the claim is bounded, the result is waited for however long
    deadline = start + args.timeout if args.timeout is not None else float("inf")
    claim_deadline = min(deadline, start + CLAIM_WAIT_S)
    doc = None
    while doc is None and time.monotonic() < claim_deadline:
        doc = _find_status(outbox, stem, own, request_id)
        if doc is None:
            time.sleep(WAIT_POLL_S)
    if doc is None:
        print(f"submitted {folder / (own + '.yml')}, not claimed yet: is the daemon running?", file=out)
        return 3
    path = outbox.status_path(doc["job_id"])
    print(path, file=out, flush=True)
    if not args.wait:
        return 0
    while doc["state"] not in TERMINAL and time.monotonic() < deadline:
        time.sleep(WAIT_POLL_S)
        doc = outbox.read_status(doc["job_id"]) or doc
    return _summary(doc, config, out, (f"{own}.yml", args.manifest.name))


def _summary(doc: dict[str, Any], config: Config, out: TextIO, named: tuple[str, str]) -> int:
    """The job's end in a line (and a failure's further lines); `named`: (the file submit dropped, the user's
    manifest), so a message about the dropped manifest names the file the user wrote."""
    state = doc["state"]
    line = f"{doc['job_id']}: {state}"
    if doc.get("bundle"):
        line += f"  bundle {config.outbox / doc['bundle']['path']}"
    said: list[str] = []
    if doc.get("error"):
        first, *said = str(doc["error"]["message"]).replace(*named).splitlines() or [""]
        line += f"  {doc['error']['code']}: {first}"
    print(printable(line), file=out)
    for more in said:  # a step's failure carries the compiler's last lines: one line each, not `\n` escapes
        print(f"  {printable(more)}", file=out)
    if state not in TERMINAL:
        print("still running: timed out waiting", file=out)
    return 0 if state == "succeeded" else 1


def status(config: Config, key: str | None, as_json: bool, out: TextIO) -> int:
    store = _store(config)
    if key:
        job = store.find(key)
        if job is None:
            raise SaigeError("INPUT_NOT_FOUND", f"no job {key}", hint=NO_JOB_HINT)
        # a pruned job's status file, if one is left (a crash between the mark and the unlink), names its old bundle
        doc = None if job.pruned_at else Outbox(config.outbox).read_status(job.job_id)
        if doc is None:
            from saigeedged.adapters.outbox import status_doc

            doc = status_doc(job)
        print(json.dumps(doc, indent=1) if as_json else _row(job), file=out)
        if job.pruned_at and not as_json:
            print(f"pruned {job.pruned_at} (retention): its bundle, log and status file are gone", file=out)
        if doc.get("accuracy") and not as_json:
            print("\n".join(printable(line) for line in accuracytable.table(doc["accuracy"])), file=out)
        if not as_json:
            print("\n".join(attempt_lines(job)), file=out)
        return 0
    jobs = store.in_state(RUNNING, QUEUED) + store.recent()
    if as_json:
        from saigeedged.adapters.outbox import status_doc

        print(json.dumps([status_doc(j) for j in jobs], indent=1), file=out)
        return 0
    print(f"{'JOB':<44} {'STATE':<10} {'STEP':<18} {'TARGET':<8} ERROR", file=out)
    for job in jobs:
        print(_row(job), file=out)
    if config.executor.slurm:  # the partition's nodes instead of the engines
        print("", *partition.lines(config), sep="\n", file=out)
    else:
        print("", *engine_lines(config, store.engines(), store.in_state(RUNNING)), sep="\n", file=out)  # one or many
    return 0


def _row(job: Job) -> str:
    step = f"{job.step} {job.step_index}/{job.step_count}" if job.step else "-"
    error = f"{job.error['code']}: {headline(job.error['message'])}" if job.error else ""
    return printable(f"{job.job_id:<44} {job.state:<10} {step:<18} {job.target:<8} {error}")


ENDED = {"succeeded": "succeeded", "failed": "failed", "cancelled": "was cancelled"}


def retry(config: Config, job_id: str, out: TextIO) -> int:
    """A failed or cancelled job back to the queue, with its inputs back under claimed/."""
    store = _store(config)
    job = _by_id(store, job_id, "retry")
    if job.pruned_at:
        raise SaigeError("INPUT_NOT_FOUND", f"job {job_id} was pruned {job.pruned_at}: retention removed its inputs",
                         hint="drop its manifest and ONNX into the inbox again")
    check_transition(job.state, QUEUED) if job.state in ACTS_ON["retry"] else None
    if job.target == "?":  # a drop refused before it was claimed (Daemon.reject): no entry to compile
        code = job.error["code"] if job.error else "INTERNAL"
        why = "its manifest never parsed" if code == "MANIFEST_INVALID" else f"its drop was refused unclaimed ({code})"
        raise SaigeError("MANIFEST_INVALID", f"job {job_id} has nothing to run again: {why}",
                         hint=f"its files are in {job.claim_dir}: fix what `saigeedged status {job_id}` says, then drop "
                         "the manifest with its ONNX into the inbox")
    if job.state not in ACTS_ON["retry"]:
        raise SaigeError("MANIFEST_INVALID", f"job {job_id} is {job.state}",
                         hint="only failed or cancelled jobs can be retried")
    if not Path(job.claim_dir).is_dir():  # removed by hand: queued again, it could only fail INPUT_NOT_FOUND
        raise SaigeError("INPUT_NOT_FOUND", f"job {job_id}: its inputs are gone: {job.claim_dir} was removed",
                         hint="drop its manifest and ONNX into the inbox again")
    from saigeedged.service.lifecycle import Jobs, Places  # docker-py and structlog: only the commands that need them

    places = Places(config.inbox, config.state_dir)
    jobs = Jobs(store, Outbox(config.outbox), places)
    sharing = [j for j in store.by_claim(job.claim_dir) if j.state in ACTS_ON["retry"] and j.job_id != job.job_id]
    dest = places.claimed / Path(job.claim_dir).name
    try:
        jobs.relocate([job, *sharing], dest)  # entries of one drop share a folder
    except OSError as exc:
        raise SaigeError("PATH_NOT_ALLOWED", f"job {job_id}: its inputs cannot be moved from {job.claim_dir} to {dest}: "
                         f"{exc.strerror or exc}", hint="run `saigeedged retry` as root or as the daemon's user, who owns "
                         "the inbox's .saigeedged folders") from None
    job.state, job.attempt, job.error, job.finished_at, job.step, job.bundle = QUEUED, job.attempt + 1, None, None, None, None
    jobs.save(job)
    print(f"{job_id}: queued again (attempt {job.attempt})", file=out)
    return 0


CANCEL_TRIES = 5  # a job racing between states (taken, requeued) settles within a few reads


def cancel(config: Config, job_id: str, out: TextIO) -> int:
    """A queued job is cancelled at once; a running one is flagged and its step killed by the daemon; one whose bundle
    is being published (Store.begin_publishing) is not: too late, exit 1 (it ends succeeded).

    The daemon may move the job meanwhile (a slot takes it, an attempt is requeued): read it again and act on its new
    state, so the operator gets one line, never a traceback.
    """
    store = _store(config)
    from saigeedged.service.lifecycle import Jobs, Places  # docker-py and structlog: only the commands that need them

    jobs = Jobs(store, Outbox(config.outbox), Places(config.inbox, config.state_dir))
    for _ in range(CANCEL_TRIES):
        job = _by_id(store, job_id, "cancel")
        if job.state in TERMINAL:  # it ended meanwhile (a cancel races the job's end): said, as "too late" is below,
            print(f"{job_id}: nothing to cancel: it already {ENDED[job.state]}", file=out)  # not a manifest's error
            return 1
        if job.state == RUNNING and store.request_cancel(job_id):
            print(f"{job_id}: cancel requested", file=out)
            return 0
        if job.state == RUNNING and store.publishing(job_id):
            print(f"{job_id}: too late to cancel: its bundle is being published", file=out)
            return 1
        if job.state == QUEUED:
            try:
                jobs.end(job, CANCELLED, SaigeError("CANCELLED", "cancelled while queued"), expect=QUEUED,
                         announce=False)  # no journal here: this is the operator's shell
            except TransitionError:
                continue  # taken by the daemon meanwhile: flag it running
            print(f"{job_id}: cancelled", file=out)
            return 0
    raise SaigeError("INTERNAL", f"job {job_id} kept changing state: not cancelled",
                     hint="run `saigeedged cancel` again")


def prune(config: Config, dry_run: bool, out: TextIO) -> int:
    """`saigeedged prune [--dry-run]`: one retention round by hand (config `retention:`)."""
    from saigeedged.adapters import retention
    from saigeedged.service.lifecycle import Places

    outputs = retention.Outputs(config.outbox, Places(config.inbox, config.state_dir).failed)
    return retention.main(_store(config), outputs, retention.Policy.from_config(config.retention), dry_run, out)


def main(args: argparse.Namespace, config: Config) -> int:
    out = sys.stdout
    if args.command == "submit":
        return submit(config, args, out)
    if args.command == "status":
        return status(config, args.job, args.json, out)
    if args.command == "prune":
        return prune(config, args.dry_run, out)
    if args.command == "retry":
        return retry(config, args.job_id, out)
    return cancel(config, args.job_id, out)
