"""The inbox scanner with time passed in (SPEC §3): settle, sha256, orphans, ignored names, symlinks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from factory import classifier, yolox

from saigeedged.compile.inputs import sha256_file
from saigeedged.intake.inbox import Drop, Rejected, Scanner, claim, ignored
from saigeedged.intake.watch import filesystem_type, use_polling

M = {"task": "detection", "num_classes": 3, "calib": "/data/val.json"}


def scanner(inbox: Path, settle: float = 2.0, orphan: float = 600.0) -> Scanner:
    return Scanner(inbox, settle, orphan, {})


def write(path: Path, data: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_settle_waits_for_unchanged_files(tmp_path: Path) -> None:
    """A drop is ready only after both files kept (size, mtime, inode) for settle_s; a change restarts the wait."""
    s = scanner(tmp_path)
    yolox(tmp_path / "det.onnx")
    write(tmp_path / "det.yml", M)
    assert s.scan(100.0) == [] and s.next_due == 102.0
    assert s.scan(101.9) == []
    with (tmp_path / "det.onnx").open("ab") as fh:
        fh.write(b"\0")
    assert s.scan(102.0) == []  # changed: the clock restarts for the ONNX
    (found,) = s.scan(104.0)
    assert isinstance(found, Drop) and found.files == [tmp_path / "det.yml", tmp_path / "det.onnx"]


def test_sha256_match_skips_settle_and_mismatch_waits(tmp_path: Path) -> None:
    """A matching digest is ready at once; a mismatch waits, then is INPUT_INCOMPLETE after orphan_timeout_s."""
    s = scanner(tmp_path, settle=3600, orphan=60)
    onnx = yolox(tmp_path / "a.onnx")
    write(tmp_path / "a.yml", {**M, "sha256": sha256_file(onnx)})
    (found,) = s.scan(0.0)
    assert isinstance(found, Drop)
    s.forget(found.files)  # as after a claim: a later drop with the same name is new
    write(tmp_path / "a.yml", {**M, "sha256": "ab" * 32})
    assert s.scan(1.0) == [] and s.scan(60.0) == []
    (bad,) = s.scan(61.0)
    assert isinstance(bad, Rejected) and bad.error.code == "INPUT_INCOMPLETE"


@pytest.mark.parametrize(("settle", "orphan"), [(900.0, 600.0), (2.0, 0.0)])
def test_a_drop_still_settling_is_waited_for_whatever_the_orphan_timeout(tmp_path: Path, settle: float,
                                                                         orphan: float) -> None:
    """orphan_timeout_s is for an ONNX that never appears or never matches `sha256:` (SPEC §3): an ONNX that is there
    and only settling is claimed once it has settled, even past orphan_timeout_s (a slow share's long settle_s, or
    orphan_timeout_s 0). It failed INPUT_INCOMPLETE "does not match the manifest's sha256" without a sha256."""
    s = scanner(tmp_path, settle=settle, orphan=orphan)
    yolox(tmp_path / "det.onnx")
    write(tmp_path / "det.yml", M)
    assert s.scan(0.0) == [] and s.scan(max(orphan, 1.0)) == []
    (found,) = s.scan(settle)
    assert isinstance(found, Drop) and found.files == [tmp_path / "det.yml", tmp_path / "det.onnx"]


def test_orphan_and_invalid_manifests(tmp_path: Path) -> None:
    """A lone manifest fails INPUT_NOT_FOUND after orphan_timeout_s; a settled unparsable one is MANIFEST_INVALID."""
    s = scanner(tmp_path, settle=1, orphan=10)
    write(tmp_path / "ghost.yml", {**M, "name": "spirit", "request_id": "r1"})
    (tmp_path / "broken.yml").write_text("task: [")
    assert s.scan(0.0) == []
    (broken,) = s.scan(1.0)
    assert isinstance(broken, Rejected) and broken.error.code == "MANIFEST_INVALID" and broken.files == [tmp_path / "broken.yml"]
    (tmp_path / "broken.yml").unlink()
    (ghost,) = s.scan(10.0)
    assert isinstance(ghost, Rejected) and ghost.error.code == "INPUT_NOT_FOUND" and "ghost.onnx" in ghost.error.message
    assert (ghost.error.fields["drop_name"], ghost.error.fields["request_id"]) == ("spirit", "r1")  # its own (submit)


def test_an_unparsable_manifest_takes_its_settled_sibling_onnx_to_failed(tmp_path: Path) -> None:
    """A drop is `<stem>.onnx` + `<stem>.yml` (SPEC §3): a settled manifest that does not parse is rejected with its
    settled sibling ONNX, both for failed/ (SPEC §8); the ONNX stayed in the inbox for good. A sibling still being
    written stays (it may be a new drop's); another manifest's ONNX is never taken."""
    s = scanner(tmp_path, settle=1)
    yolox(tmp_path / "typo.onnx")
    write(tmp_path / "typo.yml", {**M, "num_clases": 3})
    yolox(tmp_path / "arriving.onnx")
    (tmp_path / "arriving.yml").write_text("task: [")
    yolox(tmp_path / "other.onnx")
    (tmp_path / "lone.yml").write_text("onnx: other.onnx\ntask: [")
    assert s.scan(0.0) == []
    with (tmp_path / "arriving.onnx").open("ab") as fh:
        fh.write(b"\0")
    found = {r.manifest.name: r for r in s.scan(1.0)}
    assert all(isinstance(r, Rejected) and r.error.code == "MANIFEST_INVALID" for r in found.values())
    assert {name: r.files for name, r in found.items()} == {
        "typo.yml": [tmp_path / "typo.yml", tmp_path / "typo.onnx"],
        "arriving.yml": [tmp_path / "arriving.yml"],
        "lone.yml": [tmp_path / "lone.yml"]}


def test_a_rejected_manifest_never_takes_an_onnx_another_manifest_names(tmp_path: Path) -> None:
    """A broken a.yml beside a.onnx, which a good c.yml names: c's drop keeps a.onnx and a.yml fails alone (it took
    a.onnx to failed/, and c then failed INPUT_NOT_FOUND). While manifests are left unparsed in a scan (the parse
    budget), the rejection waits for the scan that has read them all."""
    s = scanner(tmp_path, settle=1)
    s.parse_budget = 1
    yolox(tmp_path / "a.onnx")
    (tmp_path / "a.yml").write_text("task: [")
    assert s.scan(0.0) == []
    write(tmp_path / "b.yml", M)  # read first (sorted): c.yml is left for the next scan
    write(tmp_path / "c.yml", {**M, "onnx": "a.onnx"})
    assert s.scan(1.0) == []  # a.yml has settled, but c.yml is unread: its rejection waits
    (rejected,) = s.scan(1.0)
    assert isinstance(rejected, Rejected) and rejected.files == [tmp_path / "a.yml"]
    s.forget(rejected.files)
    (tmp_path / "a.yml").unlink()  # as the daemon does: to failed/
    (drop,) = s.scan(2.0)
    assert isinstance(drop, Drop) and drop.files == [tmp_path / "c.yml", tmp_path / "a.onnx"]


def test_a_manifest_whose_onnx_another_manifest_took_fails_at_the_next_scan(tmp_path: Path) -> None:
    """yy.yaml and yy.yml both naming yy.onnx: one is claimed with it and the other fails at the next scan,
    INPUT_NOT_FOUND saying which manifest took it (it waited orphan_timeout_s, then said yy.onnx never appeared),
    whether both were ready in one scan or the other came later; a manifest written after the claim still waits."""
    s = scanner(tmp_path, settle=1, orphan=600)
    yolox(tmp_path / "yy.onnx")
    write(tmp_path / "yy.yaml", M)
    write(tmp_path / "yy.yml", {**M, "name": "yy2", "request_id": "r2"})
    assert s.scan(0.0) == []
    (first,) = s.scan(1.0)  # both ready: the first is claimed, the other waits for the next scan, due at once
    assert isinstance(first, Drop) and first.files == [tmp_path / "yy.yaml", tmp_path / "yy.onnx"] and s.next_due == 1.0
    claim(first.files, tmp_path, tmp_path / ".saigeedged" / "claimed" / "yy-1")
    s.forget(first.files)
    (other,) = s.scan(1.0)
    assert isinstance(other, Rejected) and other.files == [tmp_path / "yy.yml"] and other.error.code == "INPUT_NOT_FOUND"
    assert other.error.message.startswith("yy.onnx named by yy.yml went with yy.yaml, another manifest that names it")
    assert "under a name of its own" in other.error.hint and other.error.fields["request_id"] == "r2"
    s.forget(other.files)
    (tmp_path / "yy.yml").unlink()
    yolox(tmp_path / "zz.onnx")
    write(tmp_path / "zz.yml", M)
    assert s.scan(10.0) == []
    write(tmp_path / "late.yml", {**M, "onnx": "zz.onnx"})  # still settling when zz.yml is claimed with zz.onnx
    (zz,) = s.scan(11.0)
    assert isinstance(zz, Drop) and zz.files == [tmp_path / "zz.yml", tmp_path / "zz.onnx"]
    claim(zz.files, tmp_path, tmp_path / ".saigeedged" / "claimed" / "zz-1")
    s.forget(zz.files)
    (late,) = s.scan(11.0)
    assert isinstance(late, Rejected) and "zz.onnx named by late.yml went with zz.yml" in late.error.message
    s.forget(late.files)
    (tmp_path / "late.yml").unlink()
    write(tmp_path / "after.yml", {**M, "onnx": "zz.onnx"})  # zz.onnx may still come for it: the orphan wait holds
    assert s.scan(12.0) == [] and s.scan(611.0) == []


def test_a_failed_claim_of_two_drops_sharing_an_onnx_does_not_make_every_scan_due_at_once(tmp_path: Path) -> None:
    """yy.yaml and yy.yml naming one yy.onnx in a folder the daemon cannot rename in: the second is held back for a
    scan at once only the first time; while the first's claim keeps failing the next scan is not due at once (it was:
    the loop walked the inbox every 10 ms saying the failed claim). Once the claim goes through, the other fails."""
    s = scanner(tmp_path, settle=1, orphan=600)
    folder = tmp_path / "sub"
    folder.mkdir()
    yolox(folder / "yy.onnx")
    write(folder / "yy.yaml", M)
    write(folder / "yy.yml", {**M, "name": "yy2"})
    assert s.scan(0.0) == []
    (first,) = s.scan(1.0)
    assert isinstance(first, Drop) and s.next_due == 1.0  # the other looks again at once, after the claim
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        with pytest.raises(OSError):
            claim(first.files, folder, tmp_path / ".saigeedged" / "claimed" / "yy-1", tmp_path)
        for now in (1.0, 1.01, 5.0):
            (again,) = s.scan(now)
            assert again == first and s.next_due is None  # the next scan comes at the loop's interval
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    write(folder / "yy.yml", {**M, "name": "yy3"})  # changed: once settled, held back at once again
    assert s.scan(6.0) == [first] and s.scan(7.0) == [first] and s.next_due == 7.0
    claim(first.files, folder, tmp_path / ".saigeedged" / "claimed" / "yy-1", tmp_path)
    s.forget(first.files)
    (other,) = s.scan(7.0)
    assert isinstance(other, Rejected) and other.error.code == "INPUT_NOT_FOUND" and other.files == [folder / "yy.yml"]


def test_the_daemon_fails_the_manifest_that_lost_its_onnx_at_once(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """yy.yaml and yy.yml sharing yy.onnx in a daemon's inbox: one job compiles, the other fails INPUT_NOT_FOUND
    naming the manifest that took yy.onnx within seconds, not after orphan_timeout_s (600 s)."""
    d = daemon()
    shutil.copy(det_inputs["onnx"], d.inbox / "yy.onnx")
    for suffix, name in ((".yaml", "yya"), (".yml", "yyl")):
        write(d.inbox / f".yy{suffix}.tmp", {**det_inputs["manifest"], "name": name}).rename(d.inbox / f"yy{suffix}")
    done = [d.wait_job(name, timeout=30) for name in ("yya", "yyl")]
    (won,), (lost,) = ([j for j in done if j["state"] == state] for state in ("succeeded", "failed"))
    assert lost["error"]["code"] == "INPUT_NOT_FOUND"
    assert f"named by {lost['inputs']['manifest']} went with {won['inputs']['manifest']}" in lost["error"]["message"]


def test_an_unparsable_manifests_sibling_goes_with_its_external_data(tmp_path: Path) -> None:
    """The sibling ONNX's external-data file goes to failed/ with it: left behind, weights without their graph
    stayed in the inbox for good."""
    s = scanner(tmp_path, settle=1)
    model = onnx.load(str(classifier(tmp_path / "det.onnx", 3, (32, 32))))
    onnx.save(model, str(tmp_path / "det.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="det.weights", size_threshold=0)
    write(tmp_path / "det.yml", {**M, "num_clases": 3})
    assert s.scan(0.0) == []
    (bad,) = s.scan(1.0)
    assert isinstance(bad, Rejected) and bad.files == [tmp_path / "det.yml", tmp_path / "det.onnx", tmp_path / "det.weights"]


def test_ignored_names_symlinks_and_own_dir(tmp_path: Path) -> None:
    """Hidden/temp names, symlinks and the .saigeedged folder are never considered; a lone ONNX waits forever."""
    s = scanner(tmp_path, settle=0, orphan=0)
    for name in ("x.yml.tmp", "x.yml.part", "x.yml.partial", "x.yml.crdownload", "x.yml.swp", "x.yml~", ".x.yml"):
        assert ignored(name)
        write(tmp_path / name, M)
    write(tmp_path / ".saigeedged" / "claimed" / "j" / "det.yml", M)
    write(tmp_path / "elsewhere" / "real.yml", M)
    (tmp_path / "link.yml").symlink_to(tmp_path / "elsewhere" / "real.yml")
    yolox(tmp_path / "lone.onnx")
    found = s.scan(0.0)
    assert [f.manifest for f in found] == [tmp_path / "elsewhere" / "real.yml"]  # only the real one (orphan: 0)


def test_claim_keeps_relative_layout(tmp_path: Path) -> None:
    """Claim renames files under the job's folder, keeping paths relative to the manifest."""
    inbox = tmp_path / "inbox"
    write(inbox / "team" / "m.yml", M)
    (inbox / "team" / "models").mkdir(parents=True)
    yolox(inbox / "team" / "models" / "det.onnx")
    dest = inbox / ".saigeedged" / "claimed" / "job"
    ino = os.stat(inbox / "team" / "models" / "det.onnx").st_ino
    moved = claim([inbox / "team" / "m.yml", inbox / "team" / "models" / "det.onnx"], inbox / "team", dest)
    assert moved[inbox / "team" / "models" / "det.onnx"] == dest / "models" / "det.onnx"
    assert os.stat(dest / "models" / "det.onnx").st_ino == ino  # a rename, not a copy
    assert not (inbox / "team" / "m.yml").exists()


def test_a_claim_that_fails_halfway_puts_everything_back(tmp_path: Path) -> None:
    """The ONNX deleted between the scan and the claim: the manifest already renamed goes back, no claim folder
    is left, and the scanner sees the manifest alone again (an orphan, INPUT_NOT_FOUND after orphan_timeout_s)."""
    s = scanner(tmp_path, settle=1, orphan=10)
    manifest = write(tmp_path / "det.yml", M)
    yolox(tmp_path / "det.onnx")
    assert s.scan(0.0) == []
    (found,) = s.scan(1.0)
    (tmp_path / "det.onnx").unlink()
    dest = tmp_path / ".saigeedged" / "claimed" / "job"
    with pytest.raises(FileNotFoundError):
        claim(found.files, tmp_path, dest)
    assert yaml.safe_load(manifest.read_text()) == M
    assert not dest.exists()
    assert s.scan(2.0) == []
    (bad,) = s.scan(11.0)
    assert isinstance(bad, Rejected) and bad.error.code == "INPUT_NOT_FOUND" and bad.manifest == manifest


def test_network_filesystems_are_polled() -> None:
    """auto polls on NFS/CIFS (from the mount table), uses events elsewhere."""
    mounts = "/dev/vda / ext4 rw 0 0\nsrv:/x /srv/saige nfs4 rw 0 0\n//nas/in /mnt/in cifs rw 0 0\n"
    assert filesystem_type(Path("/srv/saige/inbox"), mounts) == "nfs4"
    assert use_polling("auto", Path("/mnt/in/teamA"), mounts)
    assert not use_polling("auto", Path("/var/inbox"), mounts)
    assert use_polling("poll", Path("/var/inbox"), mounts) and not use_polling("events", Path("/srv/saige"), mounts)


def test_both_files_start_settling_at_first_sight(tmp_path: Path) -> None:
    """A drop seen complete at t is ready at t + settle_s, not later (both clocks start together)."""
    s = scanner(tmp_path, settle=1.0)
    yolox(tmp_path / "det.onnx")
    write(tmp_path / "det.yml", M)
    assert s.scan(50.0) == []
    (found,) = s.scan(51.0)
    assert isinstance(found, Drop)
