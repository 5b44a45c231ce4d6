"""The .saigeedge bundle (SPEC §7): checkpoint fields, encryption, runtime_overrides."""

import zipfile
from pathlib import Path

import pytest
import pyzipper
import yaml

from saigeedged.compile import bundle


def test_deep_merge() -> None:
    """Mappings merge recursively; other values are replaced; the base is not modified."""
    base = {"postprocess": {"conf_threshold": 0.25, "iou_threshold": 0.45}, "mean": [0, 0, 0]}
    merged = bundle.deep_merge(base, {"postprocess": {"conf_threshold": 0.3}, "mean": [1], "extra": {"a": 1}})
    assert merged == {"postprocess": {"conf_threshold": 0.3, "iou_threshold": 0.45}, "mean": [1], "extra": {"a": 1}}
    assert base["postprocess"]["conf_threshold"] == 0.25


def test_plain_bundle(tmp_path: Path) -> None:
    """A plain zip with checkpoint.yaml and the model; no temp file left behind."""
    model = tmp_path / "m.nb"
    model.write_bytes(b"VPMN" + bytes(60))
    dest = tmp_path / "out" / "det.cubie.saigeedge"
    bundle.write(dest, {"model": "best.nb", "encrypted": False}, {"best.nb": model}, None)
    with zipfile.ZipFile(dest) as zf:
        assert zf.namelist() == ["checkpoint.yaml", "best.nb"]
        assert yaml.safe_load(zf.read("checkpoint.yaml"))["model"] == "best.nb"
        assert zf.read("best.nb") == model.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["det.cubie.saigeedge"]


def test_encrypted_model_readable_checkpoint(tmp_path: Path) -> None:
    """With a password the model member is WinZip AES-256; checkpoint.yaml stays readable without one."""
    model = tmp_path / "m.nb"
    model.write_bytes(b"secret weights" * 10)
    dest = tmp_path / "b.saigeedge"
    bundle.write(dest, {"encrypted": True}, {"best.nb": model}, "s3cret")
    with zipfile.ZipFile(dest) as zf:
        assert yaml.safe_load(zf.read("checkpoint.yaml")) == {"encrypted": True}
        with pytest.raises(RuntimeError, match="encrypted"):
            zf.read("best.nb")
        info = zf.getinfo("best.nb")
        assert info.compress_type == 99  # WinZip AES marker
        aes = info.extra[info.extra.index(b"\x01\x99"):]
        assert aes[6:8] == b"AE" and aes[8] == 3  # strength 3 = AES-256
    with pyzipper.AESZipFile(dest) as zf:
        zf.setpassword(b"s3cret")
        assert zf.read("best.nb") == model.read_bytes()
        zf.setpassword(b"wrong")
        with pytest.raises(RuntimeError):
            zf.read("best.nb")
    assert b"s3cret" not in dest.read_bytes()


def test_a_member_that_is_a_link_is_not_bundled(tmp_path: Path) -> None:
    """A member a step left as a symbolic link to a host file (the database, say) fails the bundle EXPORT_FAILED
    naming it, and no bundle is left."""
    from saigeedged.errors import SaigeError

    work = tmp_path / "attempt1"
    work.mkdir()
    (tmp_path / "saigeedged.db").write_text("passwords")
    (work / "m.nb").symlink_to("../saigeedged.db")
    dest = work / "det.cubie.saigeedge"
    with pytest.raises(SaigeError) as refused:
        bundle.write(dest, {"model": "m.nb", "encrypted": False}, {"m.nb": work / "m.nb"}, None, root=work)
    assert refused.value.code == "EXPORT_FAILED" and "m.nb is a symbolic link to ../saigeedged.db" in refused.value.message
    assert sorted(p.name for p in work.iterdir()) == ["m.nb"]
