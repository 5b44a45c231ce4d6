"""Command-line parsing only: each sub-command hands over to the module that does the work."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from saigeedged import __version__
from saigeedged import config as configmod
from saigeedged.adapters.store import CorruptDatabase, NewerDatabase, StoreFull
from saigeedged.cli import owner
from saigeedged.errors import ENVIRONMENT_CODES, INPUT_CODES, SaigeError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_READY = 0, 1, 2, 3
# commands on the daemon's state: run as its user (owner.py). Not `cache`: it makes no file (ls reads, clear removes),
# and as root it clears what `sudo saigeedged compile` kept there as root's, which the service's user cannot
OWN_STATE = ("status", "retry", "cancel", "prune")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="saigeedged", description="Compile ONNX models into edge-NPU bundles.")
    parser.add_argument("--version", action="version", version=f"saigeedged {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("-c", "--config", type=Path, help="daemon config (default /etc/saigeedged/saigeedged.yml)")
        return p

    add("run", "the daemon, in the foreground")
    p = add("compile", "one-shot compile of every entry of a manifest")
    p.add_argument("manifest", type=Path)
    p.add_argument("--only", action="append", default=[], metavar="TASK", help="only entries of this task or name")
    p.add_argument("--dry-run", action="store_true", help="validate and print what would be done; no Docker")
    p = add("submit", "drop a model and its manifest into the inbox safely")
    p.add_argument("model", type=Path)
    p.add_argument("manifest", type=Path)
    p.add_argument("--subdir", default="", help="sub-folder of the inbox (kept in the outbox)")
    p.add_argument("--wait", action="store_true", help="wait for the result; exit 0 succeeded, 1 failed")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait in all (default: 60 for the claim, then as long as the job takes)")
    p = add("status", "queue and recent jobs, or one job")
    p.add_argument("job", nargs="?", help="a job id or name")
    p.add_argument("--json", action="store_true")
    p = add("validate", "all input checks, no compiler")
    p.add_argument("manifest", type=Path)
    add("check", "readiness of this host: docker, images, containers, dirs, journald, inotify")
    p = add("prune", "remove old bundles, status files, logs and failed/ inputs of final jobs (config `retention:`)")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    p = add("cache", "the compile cache under state_dir: list its entries or clear it")
    p.add_argument("action", choices=("ls", "clear"))
    for name, text in (("retry", "queue a failed or cancelled job again"), ("cancel", "cancel a queued or running job")):
        p = add(name, text)
        p.add_argument("job_id")
    p = sub.add_parser("node-step", help="(run by an attempt's Slurm job) serve its steps on this compile host")
    p.add_argument("--job-dir", type=Path, required=True, help="the job's folder on the work share")
    p.add_argument("--attempt", type=int, required=True)
    p.add_argument("--target", choices=("cubie", "mobilint"), required=True)
    p.add_argument("--spec", required=True, help="the container's spec as JSON (name, image, work_root, ...)")
    return parser


def _node_step(args: argparse.Namespace) -> int:
    import json

    from saigeedged.adapters.slurm import agent

    return agent.main(args.job_dir, args.attempt, json.loads(args.spec), configmod.DEFAULTS["limits"]["engine_timeout_s"])


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "node-step":  # on a compile host: everything it needs is in its arguments, no config
        return _node_step(args)
    config = configmod.load(args.config)
    if args.command == "compile":
        from saigeedged.cli import oneshot

        with owner.handing_over(config.state_dir, skip=config.work_root):
            return oneshot.compile_manifest(config, args.manifest, args.only, args.dry_run)
    if args.command == "validate":
        from saigeedged.cli import oneshot

        return oneshot.validate(config, args.manifest)
    if args.command == "check":
        from saigeedged.cli import readiness

        return readiness.main(config)
    if args.command in OWN_STATE:
        owner.become(config.state_dir)
    if args.command == "cache":
        from saigeedged.adapters import cache

        try:
            return cache.command(config, args.action, sys.stdout)
        except PermissionError as exc:
            raise owner.refused(exc.filename or config.state_dir / "cache", exc.strerror) from None
    if args.command == "run":
        from saigeedged.cli import run

        return run.run(config)
    from saigeedged.cli import client

    return client.main(args, config)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except SaigeError as exc:
        print(f"saigeedged: {exc.code}: {exc.message}\n  hint: {exc.hint}", file=sys.stderr)
        if exc.code in INPUT_CODES:
            return EXIT_USAGE
        return EXIT_NOT_READY if exc.code in ENVIRONMENT_CODES else EXIT_FAILED
    except (CorruptDatabase, NewerDatabase) as exc:  # one line: systemd shows it, and exit 2 is not restarted in a loop
        print(f"saigeedged: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreFull as exc:  # state_dir full: restarted (exit 3) until space returns, nothing lost meanwhile
        print(f"saigeedged: {exc}", file=sys.stderr)
        return EXIT_NOT_READY
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `saigeedged status | head`: the reader has what it wanted; no traceback, and nothing
        # more for the interpreter's last flush to fail on (the recipe of Python's signal docs)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
