"""Hostile manifests (issue 9, classes 1, 4 and 8): each fails alone with MANIFEST_INVALID, echoes nothing huge or secret,
and a valid drop placed after them still succeeds with the daemon's memory bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import drop
from hostile import canary, final

from saigeedged import manifest, safeyaml
from saigeedged.errors import SaigeError

BOMB = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] +
                 [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]) + "\n"
NESTED_BOMB = ("task: mlc\nnum_classes: 1\ncalib: x.json\nruntime_overrides:\n  deep:\n    a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
               + "".join(f"    {n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdef", "bcdefg", strict=True)))
POISON = {  # the examples of issue 9 and more of each kind
    "nested": "a: " + "[" * 50_000 + "]" * 50_000,
    "nestedmap": "a: " + "{b: " * 5_000 + "1" + "}" * 5_000,
    "tilde": "task: mlc\nnum_classes: 1\ncalib: ~nosuchuser/x\n",
    "bigint": "task: mlc\nnum_classes: " + "9" * 5_000 + "\ncalib: x.json\n",
    "bigfloat": "task: mlc\nnum_classes: 1\nseed: 1" + "0" * 400 + ".5e99999\ncalib: x.json\n",
    "bomb": BOMB,
    "nestedbomb": NESTED_BOMB,
    "biglist": "a: [" + "1, " * 17_000_000 + "]\n",
    "hugevalue": "task: mlc\nnum_classes: 1\ncalib: x.json\nquantizer: " + "Q" * 900_000 + "\n",
    "tabs": "task:\tmlc\n\t- x\n",
    "binary": "\x00\x01\x02 garbage",
    "notmapping": "- a\n- b\n",
    "badname": "task: mlc\nnum_classes: 1\ncalib: x.json\nname: [1, 2]\n",
    "badmodels": "models: [{onnx: a.onnx, task: [x]}]\n",
    "nul": "task: mlc\nnum_classes: 1\ncalib: \"x\\0y\"\n",
    "bigpriority": "task: mlc\nnum_classes: 1\ncalib: x.json\npriority: 99999999999999999999\n",
    "manymodels": "models:\n" + "- {onnx: a.onnx, task: mlc, num_classes: 1, calib: x.json}\n" * 300,
}


def test_safeyaml_refuses_costly_documents() -> None:
    """Depth, alias expansion, number length and size are refused before any object is built; a normal file loads."""
    for text, words in ((POISON["nested"], "nested deeper"), (BOMB, "alias"), (POISON["bigint"], "number of 5000")):
        with pytest.raises(safeyaml.YamlRefused, match=words):
            safeyaml.check(text)
    safeyaml.check("task: detection\nnum_classes: 3\nsha256: '" + "9" * 64 + "'\nseed: 1337\n")
    with pytest.raises(safeyaml.YamlRefused, match="the key `target` is given twice"):  # YAML keeps the last silently
        safeyaml.check("task: mlc\ntarget: cubie\nnum_classes: 3\ntarget: host\n")
    safeyaml.check("base: &b {target: cubie}\nmodels:\n- {<<: *b, target: host}\n- {target: host}\n")  # not twice


def test_poison_manifests_fail_alone(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """Every poison manifest ends failed MANIFEST_INVALID with a short message; the daemon keeps claiming and stops on SIGTERM."""
    d = daemon()
    for name, text in POISON.items():
        (d.inbox / f"{name}.yml").write_text(text, encoding="utf-8", errors="surrogateescape")
    done = canary(d, det_inputs)
    for name in POISON:
        doc = final(d, f"{name}.yml")
        assert doc["state"] == "failed" and doc["error"]["code"] == "MANIFEST_INVALID", doc
        assert f"{name}.yml" in doc["error"]["message"] and doc["error"]["hint"]
        assert len(json.dumps(doc)) < 8000, f"{name}: status file of {len(json.dumps(doc))} bytes"
        assert (d.outbox / doc["log"]).stat().st_size < 8000
    assert max(len(line) for line in d.stderr().splitlines()) < 8000  # the journal/stderr copy is short too
    assert done["attempt"] == 1
    assert d.stop(timeout=30) == 0


def test_poison_manifest_left_from_before_a_restart(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """A poison manifest already in the inbox at start-up fails alone; the daemon starts and claims the next drop."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "bomb.yml").write_text(BOMB)
    (inbox / "nested.yml").write_text(POISON["nested"])
    d = daemon()
    canary(d, det_inputs)
    assert final(d, "bomb.yml")["error"]["code"] == "MANIFEST_INVALID"
    assert final(d, "nested.yml")["error"]["code"] == "MANIFEST_INVALID"


SECRET = "hunter2-s3cret"
LEAKS = {  # a password of the wrong type, or on the line of a syntax error
    "pwnumber": "task: mlc\nnum_classes: 1\ncalib: x.json\npassword: 12345678901234\n",
    "pwlist": f"task: mlc\nnum_classes: 1\ncalib: x.json\npassword: [{SECRET}]\n",
    "pwmap": f"task: mlc\nnum_classes: 1\ncalib: x.json\npassword: {{key: {SECRET}}}\n",
    "pwsyntax": f"task: mlc\nnum_classes: 1\ncalib: x.json\npassword: {SECRET}: {{\n",
    "pwquote": f"task: mlc\nnum_classes: 1\ncalib: x.json\npassword: \"{SECRET}\n",
    "pwtab": f"task: mlc\nnum_classes: 1\npassword: {SECRET}\n\t calib: x.json\n",
}


def test_password_never_echoed(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """A password of any type or on a broken line never reaches a status file, a job log or the journal stream."""
    d = daemon()
    for name, text in LEAKS.items():
        (d.inbox / f"{name}.yml").write_text(text)
    encrypted = {**det_inputs["manifest"], "password": SECRET}
    drop(d.inbox, "sealed", det_inputs["onnx"], encrypted)
    assert d.wait_job("sealed")["state"] == "succeeded"
    canary(d, det_inputs)
    for name in LEAKS:
        doc = final(d, f"{name}.yml")
        assert doc["error"]["code"] == "MANIFEST_INVALID", doc
    seen = [p.read_text(errors="replace") for p in d.outbox.rglob("*") if p.is_file() and p.suffix in (".json", ".log")]
    assert seen and not [text for text in seen if SECRET in text or "12345678901234" in text]
    assert SECRET not in d.stderr() and "12345678901234" not in d.stderr()


def test_job_database_is_private(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """The job database and its WAL (manifests with passwords) are readable by the service user only."""
    d = daemon()
    drop(d.inbox, "sealed", det_inputs["onnx"], {**det_inputs["manifest"], "password": SECRET})
    d.wait_job("sealed")
    files = [p for p in d.state_dir.glob("saigeedged.db*")]
    assert {p.name for p in files} >= {"saigeedged.db", "saigeedged.db-wal"}
    for path in files:
        assert path.stat().st_mode & 0o077 == 0, f"{path.name} mode {oct(path.stat().st_mode)}"


@pytest.mark.parametrize("forged", ["build", "source", "encrypted", "schema_version"])
def test_overrides_cannot_forge_provenance(tmp_path: Path, forged: str) -> None:
    """runtime_overrides may not rewrite the checkpoint's provenance fields."""
    path = tmp_path / "m.yml"
    path.write_text(yaml.safe_dump({"task": "mlc", "num_classes": 1, "calib": "x.json",
                                    "runtime_overrides": {forged: {"job_id": "forged"}}}))
    with pytest.raises(SaigeError, match=f"runtime_overrides.*{forged}"):
        manifest.load(path)


def test_hostile_names_are_answered(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """Long, undecodable and escape-laden names are claimed or answered by a status file, and printed safely."""
    d = daemon()
    manifest_text = yaml.safe_dump(det_inputs["manifest"])
    long_stem = "L" * 230
    drop(d.inbox, long_stem, det_inputs["onnx"], det_inputs["manifest"])
    (d.inbox / ("M" * 251 + ".yml")).write_text(manifest_text)  # 255 bytes: its ONNX's name cannot exist
    raw = os.fsencode(d.inbox) + b"/bad\xff\xfe"
    with open(raw + b".onnx", "wb") as fh:
        fh.write(det_inputs["onnx"].read_bytes())
    with open(raw + b".yml", "w") as fh:
        fh.write(manifest_text)
    escape = "esc\x1b[31mred\x07"
    drop(d.inbox, escape, det_inputs["onnx"], det_inputs["manifest"])
    (d.inbox / "bad\x1b]0;owned\x07.yml").write_text("task: nosuchtask\n")  # its error message names the file
    canary(d, det_inputs)
    assert d.wait_job(long_stem[:120])["state"] == "succeeded"
    too_long = final(d, "M" * 251 + ".yml")
    assert too_long["state"] == "failed" and too_long["error"]["code"] in ("MANIFEST_INVALID", "INPUT_NOT_FOUND")
    assert final(d, "bad\\xff\\xfe.yml")["state"] == "succeeded"
    assert final(d, "esc\\x1b[31mred\\x07.yml")["state"] == "succeeded"
    listing = subprocess.run([sys.executable, "-m", "saigeedged", "status", "-c", str(d.config)], capture_output=True,
                             text=True, check=True).stdout
    assert final(d, "bad\\x1b]0;owned\\x07.yml")["error"]["code"] == "MANIFEST_INVALID"
    assert "\x1b" not in listing and "\x07" not in listing and "bad\\x1b]0;owned\\x07.yml" in listing
    d.signal(signal.SIGTERM)


def test_deep_folder_tree_does_not_stop_the_watch(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """A 1,100-deep folder tree in the inbox neither stops the scan nor the watch; drops after it are claimed."""
    d = daemon(env={"WATCHDOG_USEC": "400000"}, watch={"poll_interval_s": 0.5})
    tree = [d.inbox / "d"]
    for _ in range(1_099):
        tree.append(tree[-1] / "d")
    try:
        for folder in tree:
            folder.mkdir()
        (tree[-1] / "lost.yml").write_text("task: mlc\n")  # below the scanned depth: never seen, never harmful
        canary(d, det_inputs)
        drop(d.inbox / "after", "late", det_inputs["onnx"], det_inputs["manifest"])
        assert d.wait_job("late")["state"] == "succeeded"
        d.expect("WATCHDOG=1", 5, after=len(d.messages))  # still healthy: the loop pings systemd's watchdog
        assert d.events("watch.too_deep")  # and says why it polls now
    finally:  # bottom-up: pytest's own (recursive) clean-up of old temp folders would fail on this tree
        d.kill()
        (tree[-1] / "lost.yml").unlink(missing_ok=True)
        for folder in reversed(tree):
            if folder.is_dir():
                folder.rmdir()


@pytest.mark.journald
def test_undecodable_names_reach_the_journal_escaped(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """A symlink and a drop whose names are not UTF-8 are journaled with their bytes escaped; the scan goes on."""
    d = daemon(log={"format": "journal"})
    os.symlink(tmp_path, os.fsencode(d.inbox) + b"/link\xff")
    raw = os.fsencode(d.inbox) + b"/odd\xfe"
    with open(raw + b".onnx", "wb") as fh:
        fh.write(det_inputs["onnx"].read_bytes())
    with open(raw + b".yml", "w") as fh:
        fh.write(yaml.safe_dump(det_inputs["manifest"]))
    assert final(d, "odd\\xfe.yml")["state"] == "succeeded"
    canary(d, det_inputs)
    journal = subprocess.run(["journalctl", "--no-pager", "-o", "json", f"_PID={d.proc.pid if d.proc else 0}"],
                             capture_output=True, text=True).stdout
    assert "link\\\\xff" in journal and "odd\\\\xfe.yml" in journal
