"""Which missing compiler images the journal warns about (service/missingimages.py), on a real state_dir."""

from __future__ import annotations

from pathlib import Path

from saigeedged.service.missingimages import RECORD, MissingImages

CUBIE, MOBILINT = ("cubie", "ubuntu-npu:v2.0.10.1"), ("mobilint", "mobilint/qbcompiler:1.3-cpu-ubuntu22.04")


def test_only_asked_targets_once_across_restarts(tmp_path: Path) -> None:
    """A target nobody asks for is never warned about; an asked one once, also for a new instance on the same
    state_dir (a restart), and per engine."""
    asked = {"cubie"}
    first = MissingImages(tmp_path, lambda: asked)
    assert first.to_warn("local", [CUBIE, MOBILINT]) == [CUBIE]
    assert first.to_warn("local", [CUBIE, MOBILINT]) == []
    again = MissingImages(tmp_path, lambda: asked)
    assert again.to_warn("local", [CUBIE, MOBILINT]) == [] and again.to_warn("compile2", [CUBIE]) == [CUBIE]
    asked.add("mobilint")  # a mobilint job queued
    assert again.to_warn("local", [CUBIE, MOBILINT]) == [MOBILINT]


def test_an_image_loaded_then_gone_is_warned_again(tmp_path: Path) -> None:
    """Once the image is seen on the engine the warning is forgotten: losing it again is news; so is another tag."""
    images = MissingImages(tmp_path, lambda: {"cubie"})
    assert images.to_warn("local", [CUBIE]) == [CUBIE]
    images.forget("local", [CUBIE])
    assert MissingImages(tmp_path, lambda: {"cubie"}).to_warn("local", [CUBIE]) == [CUBIE]
    assert images.to_warn("local", [("cubie", "ubuntu-npu:v2.1")]) == [("cubie", "ubuntu-npu:v2.1")]


def test_an_unreadable_record_warns_again_and_is_rewritten(tmp_path: Path) -> None:
    """A damaged record is no reason to stay silent: the warning comes again and the record is whole after it."""
    (tmp_path / RECORD).write_text("{not json")
    images = MissingImages(tmp_path, lambda: {"cubie"})
    assert images.to_warn("local", [CUBIE]) == [CUBIE]
    assert MissingImages(tmp_path, lambda: {"cubie"}).to_warn("local", [CUBIE]) == []
