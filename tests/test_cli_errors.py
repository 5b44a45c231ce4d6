"""Bad input on the command line: its stable code, the field or file named, a hint, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from factory import classifier, manifest, random_labels, valjson, yolox

from saigeedged.cli import main as cli
from saigeedged.errors import SaigeError


def inputs(tmp_path: Path) -> dict[str, Any]:
    yolox(tmp_path / "det.onnx")
    calib = valjson(tmp_path / "data", random_labels(6, 3))
    return {"task": "detection", "num_classes": 3, "calib": str(calib), "target": "host"}


def break_calib_label(tmp_path: Path) -> None:
    data = json.loads((tmp_path / "data" / "val.json").read_text())
    data["validation"][2]["labels"] = [7]
    (tmp_path / "data" / "val.json").write_text(json.dumps(data))


CASES = [
    ("unknown key", lambda t, m: m.update(calib_path="x"), None, "MANIFEST_INVALID", "calib_path"),
    ("num_classes 0", lambda t, m: m.update(num_classes=0), None, "MANIFEST_INVALID", "num_classes"),
    ("missing onnx", lambda t, m: m.update(onnx="nope.onnx"), None, "INPUT_NOT_FOUND", "nope.onnx"),
    ("symbolic", lambda t, m: classifier(t / "det.onnx", batch="N"), None, "SYMBOLIC_DIM", "dim"),
    ("size mismatch", lambda t, m: m.update(input_size=[32, 32]), None, "INPUT_SIZE_MISMATCH", "input_size"),
    ("airockchip", lambda t, m: yolox(t / "det.onnx", head_prefix="/model/Concat"), None,
     "SURGERY_OUTPUTS_NOT_FOUND", "/head/Concat_output_0"),
    ("wrong task", lambda t, m: classifier(t / "det.onnx", size=(64, 64)), None, "SURGERY_OUTPUTS_NOT_FOUND", "det.onnx"),
    ("calib label", lambda t, m: break_calib_label(t), None, "CALIB_INVALID", "img0002.jpg"),
    ("two inputs", lambda t, m: classifier(t / "det.onnx", extra_input=True), None, "ONNX_INVALID", "one input"),
]


@pytest.mark.parametrize(("label", "mutate", "_", "code", "named"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2(tmp_path: Path, config_path: Path, capsys: Any, label: str, mutate: Any, _: Any,
                           code: str, named: str) -> None:
    """compile, compile --dry-run and validate all stop with the code, the name and a hint."""
    fields = inputs(tmp_path)
    mutate(tmp_path, fields)
    mf = manifest(tmp_path / "det.yml", **fields)
    for argv in (["compile", str(mf)], ["compile", str(mf), "--dry-run"], ["validate", str(mf)]):
        assert cli.main([*argv, "-c", str(config_path)]) == 2, argv
        err = capsys.readouterr().err
        assert f"saigeedged: {code}:" in err and named in err and "hint:" in err, err
        assert "Traceback" not in err


def test_no_traceback_from_the_real_command(tmp_path: Path, config_path: Path) -> None:
    """The installed entry point prints one error line and a hint, exit 2."""
    fields = inputs(tmp_path)
    fields["task"] = "segmentation"
    mf = manifest(tmp_path / "det.yml", **fields)
    run = subprocess.run([sys.executable, "-m", "saigeedged", "validate", str(mf), "-c", str(config_path)],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.startswith("saigeedged: MANIFEST_INVALID: det.yml: `task` must be one of detection, mlc, reid")
    assert "Traceback" not in run.stderr


def test_output_into_a_closed_pipe_is_no_traceback(config_path: Path) -> None:
    """`saigeedged status | head -1`: the reader gone, the command ends quietly with 128 + SIGPIPE, as a C tool would
    (it printed a BrokenPipeError traceback, exit 1). Here the pipe has no reader at all, so the first write fails."""
    from saigeedged import config as configmod
    from saigeedged.adapters.store import Store

    state_dir = configmod.load(config_path).state_dir
    state_dir.mkdir(parents=True)
    Store(state_dir / "saigeedged.db").close()
    read, write = os.pipe()
    os.close(read)
    try:
        for argv in (["status"], ["status", "--json"]):
            run = subprocess.run([sys.executable, "-m", "saigeedged", *argv, "-c", str(config_path)], stdout=write,
                                 stderr=subprocess.PIPE, text=True)
            assert (run.returncode, run.stderr) == (128 + signal.SIGPIPE, ""), run.stderr
    finally:
        os.close(write)


def test_submit_wait_prints_a_failures_lines_one_by_one(config_path: Path) -> None:
    """`submit --wait` of a job whose step failed: the code and the message's first line, then the compiler's last
    lines each on a line of its own (they were one line of `\\n` escapes)."""
    import io

    from saigeedged import config as configmod
    from saigeedged.cli.client import _summary

    out = io.StringIO()
    doc = {"job_id": "x-1", "state": "failed", "error": {"code": "STEP_FAILED", "message":
                                                         "`pegasus import` exited 1; last lines:\nTraceback\nboom\x1b[2J"}}
    assert _summary(doc, configmod.load(config_path), out, ("x.1a2b3c4d.yml", "x.yml")) == 1
    assert out.getvalue().splitlines() == ["x-1: failed  STEP_FAILED: `pegasus import` exited 1; last lines:",
                                           "  Traceback", "  boom\\x1b[2J"]


def test_validate_prints_the_resolved_profile(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """validate runs every check and prints input size, outputs and steps."""
    mf = manifest(tmp_path / "det.yml", **inputs(tmp_path))
    assert cli.main(["validate", str(mf), "-c", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert "input_size  [64, 64]" in out and "[[1, 8, 8, 8], [1, 8, 4, 4], [1, 8, 2, 2]]" in out and "det.yml: valid" in out
    # whether the job will have an accuracy report and a gate (SPEC §17): a calibration file no larger than n_samples
    # leaves none, which the job log alone said
    assert "  warning     no accuracy report and no gate: calibration uses every one of the 6 images (n_samples " \
           "100): add images to the calibration file or lower n_samples" in out.splitlines()
    for fields, said in (({"n_samples": 4}, "  accuracy    2 held-out images of 16 asked"),
                         ({"eval_samples": 0}, "  warning     no accuracy report and no gate: eval_samples is 0")):
        mf = manifest(tmp_path / "det.yml", **{**inputs(tmp_path), **fields})
        assert cli.main(["validate", str(mf), "-c", str(config_path)]) == 0
        assert said in capsys.readouterr().out.splitlines()


def test_validate_warns_of_a_calibration_file_a_daemon_would_refuse(tmp_path: Path, capsys: Any) -> None:
    """With a daemon config, validate warns that a calibration file (or its images) outside the inbox and
    allowed_roots makes the drop fail PATH_NOT_ALLOWED (it said `valid`, and `submit` then failed); inside, no word."""
    mf = manifest(tmp_path / "det.yml", **inputs(tmp_path))
    outside = write_config(tmp_path)
    assert cli.main(["validate", str(mf), "-c", str(outside)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "PATH_NOT_ALLOWED" in line]
    assert said and said[0].startswith("  warning     a daemon with this config refuses the drop") and \
        f"{tmp_path / 'data' / 'val.json'} resolves to" in said[0] and "allowed_roots" in said[0]
    inside = write_config(tmp_path, allowed_roots=[str(tmp_path / "data")])
    assert cli.main(["validate", str(mf), "-c", str(inside)]) == 0
    assert "PATH_NOT_ALLOWED" not in capsys.readouterr().out


def test_only_selects_entries(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """--only TASK keeps the entries of that task; no match is an error."""
    fields = inputs(tmp_path)
    classifier(tmp_path / "cls.onnx", 3, (224, 224))
    mf = manifest(tmp_path / "m.yml", target="host", models=[
        {**fields, "onnx": "det.onnx"}, {**fields, "task": "mlc", "onnx": "cls.onnx"}])
    assert cli.main(["compile", str(mf), "--only", "mlc", "--dry-run", "-c", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert "m.mlc: task mlc" in out and "m.detection" not in out
    assert cli.main(["compile", str(mf), "--only", "reid", "--dry-run", "-c", str(config_path)]) == 2


def test_submit_refuses_what_is_not_a_file(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """A pipe or a folder as the manifest is named as such, exit 2, nothing dropped."""
    onnx = yolox(tmp_path / "m.onnx", size=(64, 64))
    assert cli.main(["submit", str(onnx), str(tmp_path), "-c", str(config_path)]) == 2
    err = capsys.readouterr().err
    assert "INPUT_NOT_FOUND" in err and "is not a regular file" in err and "write the manifest to a file" in err
    twice = tmp_path / "twice.yml"  # read as the daemon reads it: submit re-wrote it with the last value, silently
    twice.write_text("task: mlc\ntarget: cubie\nnum_classes: 3\ntarget: host\ncalib: x.json\n")
    assert cli.main(["submit", str(onnx), str(twice), "-c", str(config_path)]) == 2
    from saigeedged import config as configmod

    err = capsys.readouterr().err
    assert "MANIFEST_INVALID" in err and "given twice" in err and not list(configmod.load(config_path).inbox.glob("tw*"))


def test_job_commands_name_what_to_do_next(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """`cancel`/`retry`/`status` of no such job hint at `saigeedged status` (they gave the manifest-path hint), a missing
    -c file at the installed config, and `retry` of a drop whose manifest never parsed says where its files are (it
    said "failed" jobs can be retried, of a failed job); `cancel` of a job that ended says so, exit 1 (it said
    MANIFEST_INVALID)."""
    from saigeedged import config as configmod
    from saigeedged.adapters.store import Store
    from saigeedged.jobs import FAILED, Job

    state_dir = configmod.load(config_path).state_dir
    state_dir.mkdir(parents=True)
    store = Store(state_dir / "saigeedged.db")
    for job_id, code in (("typo-1", "MANIFEST_INVALID"), ("ghost-1", "INPUT_NOT_FOUND")):
        name = job_id.split("-")[0]
        store.add(Job(job_id, name, "?", "?", {"onnx": f"/c/{name}.onnx"}, "", f"/inbox/.saigeedged/failed/{job_id}",
                      f"{name}.yml", state=FAILED, error={"code": code, "message": "..."}))
    store.add(Job("typo-2", "typo", "cubie", "detection", {"onnx": "/c/typo.onnx"}, "", "/c/typo-2", "typo.yml"))
    store.close()

    def refused(*argv: str) -> tuple[str, str]:
        assert cli.main(list(argv)) == 2
        first, hint = capsys.readouterr().err.splitlines()
        return first, hint

    for command in ("cancel", "retry", "status"):
        first, hint = refused(command, "nosuchjob", "-c", str(config_path))
        assert first == "saigeedged: INPUT_NOT_FOUND: no job nosuchjob" and "`saigeedged status` lists" in hint
    first, hint = refused("status", "-c", str(tmp_path / "nope.yml"))
    assert "not found" in first and "/etc/saigeedged/saigeedged.yml" in hint
    first, hint = refused("retry", "typo-1", "-c", str(config_path))
    assert "manifest never parsed" in first and "/inbox/.saigeedged/failed/typo-1" in hint
    first, hint = refused("retry", "ghost-1", "-c", str(config_path))  # its manifest parsed: its ONNX never came
    assert first.endswith("refused unclaimed (INPUT_NOT_FOUND)") and "/inbox/.saigeedged/failed/ghost-1" in hint
    for command, newest in (("cancel", "typo-2"), ("retry", "typo-1")):  # ids only (a name may be many jobs): a name
        first, hint = refused(command, "typo", "-c", str(config_path))  # gets the newest id the command can act on
        assert first == "saigeedged: INPUT_NOT_FOUND: no job typo" and hint.endswith(f"to {command} is {newest}"), hint
    assert cli.main(["cancel", "typo-1", "-c", str(config_path)]) == 1  # ended (a cancel racing its end): said as
    assert capsys.readouterr().out == "typo-1: nothing to cancel: it already failed\n"  # such, not MANIFEST_INVALID


def test_a_held_out_image_that_does_not_decode_stops_validate(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """A truncated held-out image is CALIB_INVALID naming it (exit 2) in validate, --dry-run and compile, and in the
    daemon's validate step (prepare.inspect_job), before any compile step: not INTERNAL after the compile."""
    from saigeedged import manifest as manifestmod
    from saigeedged.compile import calibration, prepare
    from saigeedged.compile.inputs import PathPolicy

    fields = {**inputs(tmp_path), "calib": str(valjson(tmp_path / "data", random_labels(24, 3))), "n_samples": 8}
    calib = calibration.read(Path(fields["calib"]), 3)
    held = calibration.held_out(calib, calibration.pick(calib, 8, 0, "balanced"), 16, 0, "balanced")
    broken = held[0].image
    broken.write_bytes(broken.read_bytes()[:300])
    mf = manifest(tmp_path / "det.yml", **fields, seed=0)
    for argv in (["validate", str(mf)], ["compile", str(mf), "--dry-run"], ["compile", str(mf)]):
        assert cli.main([*argv, "-c", str(config_path)]) == 2, argv
        err = capsys.readouterr().err
        assert "saigeedged: CALIB_INVALID:" in err and broken.name in err and "held-out" in err and "hint:" in err, err
    entry = manifestmod.load(mf)[0]
    with pytest.raises(SaigeError) as exc:
        prepare.inspect_job(entry, tmp_path / "work", PathPolicy(), "0" * 64)
    assert exc.value.code == "CALIB_INVALID" and broken.name in exc.value.message


def test_a_coco_file_with_boxes_that_are_none_compiles_and_the_report_says_so(tmp_path: Path, config_path: Path,
                                                                               capsys: Any) -> None:
    """COCO with `"bbox": null`, a NaN box, a box entirely outside its image, annotations without `bbox` among boxed
    ones and one image file on two entries: validate, --dry-run and the daemon's validate step take it (these refused
    it CALIB_INVALID, breaking files that compiled before), and the compiled bundle's accuracy report counts what it
    dropped and left out of mAP against labels."""
    import zipfile

    from saigeedged import manifest as manifestmod
    from saigeedged.cli.examples import image
    from saigeedged.compile import prepare
    from saigeedged.compile.inputs import PathPolicy

    (tmp_path / "coco").mkdir()
    for i in range(12):
        image(tmp_path / "coco" / f"img{i}.jpg", i, size=(64, 64))
    bboxes: list[Any] = [None, [float("nan"), 4, 20, 10], [5000, 5000, 50, 50], "no bbox"] + [[4, 4, 30, 20]] * 8
    anns = [{"id": i, "image_id": i, "category_id": 1 + i % 3, **({} if b == "no bbox" else {"bbox": b})}
            for i, b in enumerate(bboxes)]
    data = {"images": [{"id": i, "file_name": f"img{i}.jpg"} for i in range(12)] + [{"id": 99, "file_name": "img5.jpg"}],
            "annotations": [*anns, {"id": 99, "image_id": 99, "category_id": 3, "bbox": [40, 40, 10, 10]}],
            "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]}
    (tmp_path / "coco" / "instances.json").write_text(json.dumps(data), encoding="utf-8")
    fields = {**inputs(tmp_path), "calib": str(tmp_path / "coco" / "instances.json"), "n_samples": 1,
              "eval_samples": 11, "onnx": str(yolox(tmp_path / "det64.onnx", size=(64, 64))),
              "output": str(tmp_path / "det.saigeedge"), "seed": 3}
    mf = manifest(tmp_path / "det.yml", **fields)
    for argv in (["validate", str(mf)], ["compile", str(mf), "--dry-run"]):
        assert cli.main([*argv, "-c", str(config_path)]) == 0, capsys.readouterr().err
    prep = prepare.inspect_job(manifestmod.load(mf)[0], tmp_path / "work", PathPolicy(), "0" * 64)
    assert len(prep.calib.samples) + len(prep.held_out) == 12
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0, capsys.readouterr().err
    with zipfile.ZipFile(tmp_path / "det.saigeedge") as zf:
        report = json.loads(zf.read("accuracy.json"))
    assert sorted(report["held_out"]) == sorted(f"img{i}.jpg" for i in range(1, 12))  # img0 calibrates (seed 3)
    assert report["notes"] == ["2 ground-truth box(es) dropped: not a box (no finite [x, y, width, height] with width "
                               "and height above 0) or entirely outside its image",
                               "3 held-out image(s) left out of mAP against labels: a label without a usable box"]
    assert "labels" not in report["task"] and report["task"]["float"] is not None, report["task"]
