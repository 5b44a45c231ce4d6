"""Drops that aim at other jobs' files or at the daemon's own folders (issue 9, classes 2 and 3): refused or
published in their own place; nothing another job published changes, and a recorded digest is always true."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from factory import yolox
from harness import drop, wait_for
from hostile import canary, final

from saigeedged import files, guards
from saigeedged.adapters import noclobber
from saigeedged.compile.inputs import sha256_file


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its digest."""
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def test_outputs_cannot_reach_other_places(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """`output:` naming status/, logs/, another team's folder, `.` or a non-bundle fails; the victim's files stay as they were."""
    d = daemon()
    drop(d.inbox / "teamB", "victim", det_inputs["onnx"], det_inputs["manifest"])
    victim = d.wait_job("victim")
    assert victim["state"] == "succeeded"
    before = snapshot(d.outbox)
    aims = {"status": f"status/{victim['job_id']}.json", "logs": f"logs/{victim['job_id']}.log",
            "team": "teamB/victim.host.saigeedge", "dot": ".", "dotdot": "..", "hidden": ".x.saigeedge",
            "json": f"{victim['job_id']}.json", "empty": ".saigeedge", "backslash": "a\\b.saigeedge",
            "long": "x" * 250 + ".saigeedge", "newline": "a\nb.saigeedge"}
    for name, output in aims.items():
        drop(d.inbox, name, det_inputs["onnx"], {**det_inputs["manifest"], "output": output})
    canary(d, det_inputs)
    for name in aims:
        doc = final(d, f"{name}.yml")
        assert doc["state"] == "failed" and doc["error"]["code"] == "MANIFEST_INVALID", doc
        assert "`output`" in doc["error"]["message"]
    after = snapshot(d.outbox)
    assert {k: v for k, v in after.items() if k in before} == before


def test_drops_in_an_inbox_folder_named_like_the_outbox_own(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """Drops in inbox/status/ or inbox/logs/ would publish among status files and logs: they fail, nothing lands there."""
    d = daemon()
    for folder in ("status", "logs"):
        drop(d.inbox / folder, f"in{folder}", det_inputs["onnx"], det_inputs["manifest"])
    canary(d, det_inputs)
    for folder in ("status", "logs"):
        doc = final(d, f"in{folder}.yml")
        assert doc["state"] == "failed" and doc["error"]["code"] == "MANIFEST_INVALID", doc
        assert f"`{folder}/`" in doc["error"]["message"]
    assert {p.suffix for p in (d.outbox / "status").iterdir()} == {".json"}
    assert {p.suffix for p in (d.outbox / "logs").iterdir()} == {".log"}


def test_redrop_never_replaces_a_published_bundle(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """A second drop of the same name publishes under a name of its own: both recorded digests stay true."""
    d = daemon()
    drop(d.inbox, "same", det_inputs["onnx"], det_inputs["manifest"])
    first = d.wait_job("same")
    other = yolox(tmp_path / "other.onnx", size=(64, 64), seed=7)
    drop(d.inbox, "same", other, det_inputs["manifest"])
    second = wait_for(lambda: next((s for s in d.statuses() if s["name"] == "same" and s["job_id"] != first["job_id"]
                                    and s["state"] in ("succeeded", "failed")), None), 60, "the second drop")
    assert first["bundle"]["path"] == "same.host.saigeedge" and second["bundle"]["path"] != first["bundle"]["path"]
    assert second["bundle"]["path"].startswith("same.host.") and second["bundle"]["path"].endswith(".saigeedge")
    for doc in (first, second):
        assert sha256_file(d.outbox / doc["bundle"]["path"]) == doc["bundle"]["sha256"]
    assert first["bundle"]["sha256"] != second["bundle"]["sha256"]


def test_own_folders_replaced_by_symlinks_are_never_followed(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """claimed/ and failed/ swapped for symlinks: drops never move into the link's target; the folders are the service's."""
    d = daemon()
    own = d.inbox / ".saigeedged"
    elsewhere = {name: tmp_path / f"elsewhere-{name}" for name in ("claimed", "failed")}
    for name, target in elsewhere.items():
        target.mkdir()
        (own / name).rmdir()
        (own / name).symlink_to(target)
    (d.inbox / "broken.yml").write_text(yaml.safe_dump({"task": "nosuchtask"}))
    assert final(d, "broken.yml")["state"] == "failed"
    (own / "failed").rename(own / "failed.mine")  # again, once the daemon made its own: now for a job failing later
    (own / "failed").symlink_to(elsewhere["failed"])
    drop(d.inbox, "latefail", det_inputs["onnx"], {**det_inputs["manifest"], "num_classes": 5})
    assert final(d, "latefail.yml")["error"]["code"] == "CALIB_INVALID"
    canary(d, det_inputs)
    assert not [p for target in elsewhere.values() for p in target.iterdir()]
    for name in ("claimed", "failed"):
        assert (own / name).is_dir() and not (own / name).is_symlink()
    assert len(list((own / "failed").glob("*/latefail.yml"))) == 1
    for folder in (own, own / "claimed", own / "failed"):
        assert os.stat(folder).st_mode & 0o022 == 0, f"{folder} is writable by others"


def test_recovery_never_follows_a_failed_folder_symlink(daemon: Any, tmp_path: Path) -> None:
    """A claimed folder settled at start goes under the service's own failed/, not where a symlinked failed/ points."""
    d = daemon()
    assert d.stop() == 0
    own = d.inbox / ".saigeedged"
    stray = own / "claimed" / "stray-20261130T000000Z-abcdef"
    stray.mkdir()
    (stray / "stray.yml").write_text("task: detection\n")
    elsewhere = tmp_path / "elsewhere-failed"
    elsewhere.mkdir()
    (own / "failed").rmdir()
    (own / "failed").symlink_to(elsewhere)
    d.start()
    assert d.wait_state(stray.name, ("failed",), timeout=10)["error"]["code"] == "INTERNAL"
    assert not list(elsewhere.iterdir())
    assert not (own / "failed").is_symlink() and (own / "failed" / stray.name / "stray.yml").is_file()


def test_output_rule_and_unique_names() -> None:
    """Only a visible `<name>.saigeedge` without folders is a drop's output; a taken name gets the job's time and tag."""
    assert guards.output_problem("det.cubie.saigeedge") is None
    for bad in ("sub/det.saigeedge", "../det.saigeedge", ".", "det.zip", ".det.saigeedge", "x\x1b.saigeedge"):
        assert guards.output_problem(bad), bad
    assert guards.subdir_problem("status") and guards.subdir_problem("logs/a") and not guards.subdir_problem("teamA/status")
    rel = noclobber.unique_name(Path("teamA/det.host.saigeedge"), "det-20261130T031500Z-a1b2c3")
    assert rel == Path("teamA/det.host.20261130T031500Z-a1b2c3.saigeedge")


def test_take_never_replaces(tmp_path: Path) -> None:
    """files.take moves a finished file to a free name and refuses a taken one, leaving both files as they were."""
    (tmp_path / "taken").write_text("first")
    tmp = tmp_path / ".new.tmp"
    tmp.write_text("second")
    assert not files.take(tmp, tmp_path / "taken") and (tmp_path / "taken").read_text() == "first" and tmp.exists()
    assert files.take(tmp, tmp_path / "free") and (tmp_path / "free").read_text() == "second" and not tmp.exists()


def test_a_bundle_swapped_for_a_link_before_its_publish_is_never_copied(tmp_path: Path) -> None:
    """The bundle waits in the job's work folder, which the next job's container step shares: swapped for a symbolic
    link to a host file (the database) before it is published, the publish fails PUBLISH_FAILED and the outbox gets
    nothing; a regular bundle is published."""
    import pytest

    from saigeedged.adapters.outbox import Outbox
    from saigeedged.errors import SaigeError

    work, outbox = tmp_path / "work" / "job" / "attempt1", Outbox(tmp_path / "outbox")
    work.mkdir(parents=True)
    (tmp_path / "saigeedged.db").write_text("passwords")
    (work / "det.saigeedge").symlink_to("../../../saigeedged.db")
    with pytest.raises(SaigeError) as refused:
        outbox.publish_bundle(work / "det.saigeedge", Path("det.host.saigeedge"), "job")
    assert refused.value.code == "PUBLISH_FAILED" and "symbolic link" in refused.value.message
    assert not list((tmp_path / "outbox").rglob("*.saigeedge"))
    (work / "det.saigeedge").unlink()
    (work / "det.saigeedge").write_bytes(b"PK")
    assert outbox.publish_bundle(work / "det.saigeedge", Path("det.host.saigeedge"), "job")["bytes"] == 2
    assert (tmp_path / "outbox" / "det.host.saigeedge").read_bytes() == b"PK"


def test_a_gate_refused_bundle_is_kept_as_a_copy_of_a_regular_file_only(tmp_path: Path) -> None:
    """A bundle below the accuracy gate is kept beside the claimed inputs (failed/ once moved): a copy, so a later
    write into the work folder's file (the next job's step shares it) leaves the kept one alone; a link swapped in
    for the bundle is not kept, and the job's error says so."""
    from types import SimpleNamespace

    from saigeedged.compile import pipeline
    from saigeedged.compile.inputs import PathPolicy

    work, claim = tmp_path / "work" / "job" / "attempt1", tmp_path / "inbox" / "claimed" / "job"
    work.mkdir(parents=True)
    claim.mkdir(parents=True)
    job: Any = SimpleNamespace(policy=PathPolicy((claim,)), refused_to=None)
    measured = {"method": "cosine", "images": 2, "gate": {"failures": ["min_cosine 0.5 < 0.95"]}}
    bundle = work / "det.saigeedge"
    bundle.write_bytes(b"PK gated")
    error = pipeline._refused(job, bundle, measured)
    assert error.code == "ACCURACY_GATE" and "kept as det.saigeedge" in error.message
    with bundle.open("r+b") as fh:  # the next job's step writes into the file it finds in the shared work folder
        fh.write(b"XX")
    assert (claim / "det.saigeedge").read_bytes() == b"PK gated"
    (claim / "det.saigeedge").unlink()
    (tmp_path / "saigeedged.db").write_text("passwords")
    bundle.unlink()
    bundle.symlink_to("../../../saigeedged.db")
    error = pipeline._refused(job, bundle, measured)
    assert "not kept (no longer a file of the work folder)" in error.message
    assert not (claim / "det.saigeedge").exists()
