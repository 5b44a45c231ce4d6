"""The compile cache against a real Docker engine and the stand-in ACUITY image (SPEC §12)."""

from __future__ import annotations

import io
import signal
import subprocess
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import IMAGES
from factory import manifest, yolox
from harness import container_output, drop, wait_for

from saigeedged import config as configmod
from saigeedged.cli import main as cli

pytestmark = pytest.mark.docker


@pytest.fixture
def cache_daemon(docker_config: Path, daemon: Any, fresh_acuity: str) -> Any:
    """daemon(...) compiling for cubie in this test's container of the session's own stand-in image."""
    settings = yaml.safe_load(docker_config.read_text())

    def start(**overrides: Any) -> Any:
        return daemon(cubie={**settings["cubie"], "image": fresh_acuity}, limits=settings["limits"],
                      defaults={"target": "cubie"}, **overrides)

    return start


def calls(docker_client: Any, d: Any, what: str) -> list[str]:
    """The stand-in's record of its calls in the daemon's container, those containing `what`."""
    name = yaml.safe_load(d.config.read_text())["cubie"]["container"]
    out = container_output(docker_client.containers.get(name), ["cat", "/tmp/standin-calls.log"])
    return [line for line in out.splitlines() if what in line]


def member(d: Any, doc: dict[str, Any]) -> tuple[dict[str, Any], bytes, list[str]]:
    with zipfile.ZipFile(d.outbox / doc["bundle"]["path"]) as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        return ckpt, zf.read(ckpt["model"]), zf.namelist()


def test_identical_redrop_hits_without_running_the_compiler(cache_daemon: Any, docker_client: Any,
                                                            det_inputs: dict[str, Any]) -> None:
    """The same model dropped again succeeds as a hit: pegasus is not called again, the NBG is byte-identical,
    the status file names the source job and the checkpoint names the new job."""
    d = cache_daemon()
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    first = d.wait_job("det")
    assert first["state"] == "succeeded" and first["cache"]["hit"] is False and first["step_count"] == 11
    a, nbg_a, names = member(d, first)  # the re-drop publishes to the same path
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    second = wait_for(lambda: next((s for s in d.statuses() if s["job_id"] != first["job_id"]
                                    and s["state"] == "succeeded"), None), 60, "the re-drop to succeed")
    assert second["cache"] == {"hit": True, "key": first["cache"]["key"], "source_job_id": first["job_id"]}
    assert second["step_count"] == 5 and second["bundle"]["sha256"]
    assert len(calls(docker_client, d, "pegasus.py export")) == 1 and len(calls(docker_client, d, "pegasus.py import")) == 1
    b, nbg_b, _ = member(d, second)
    assert nbg_a == nbg_b and nbg_b[:4] == b"VPMN"
    assert b["build"]["job_id"] == second["job_id"] and a["build"]["job_id"] == first["job_id"]
    assert b["cache_key"] == first["cache"]["key"] and b["toolchain"]["image_id"].startswith("sha256:")
    assert b["input_channels"] == "bgr" and "calib_digests.txt" in names
    log = (d.outbox / second["log"]).read_text()
    assert f"cache: hit {first['cache']['key']}" in log and "$ python3" not in log


def test_two_identical_drops_queued_together_compile_once(cache_daemon: Any, docker_client: Any,
                                                          det_inputs: dict[str, Any]) -> None:
    """Two identical drops claimed together: the first compiles, the second waits for it and hits."""
    d = cache_daemon()
    drop(d.inbox, "twin1", det_inputs["onnx"], det_inputs["manifest"])
    drop(d.inbox, "twin2", det_inputs["onnx"], det_inputs["manifest"])
    docs = [d.wait_job(n) for n in ("twin1", "twin2")]
    assert [doc["state"] for doc in docs] == ["succeeded", "succeeded"]
    hits = sorted(docs, key=lambda doc: doc["cache"]["hit"])
    assert hits[0]["cache"]["hit"] is False and hits[1]["cache"]["source_job_id"] == hits[0]["job_id"]
    assert len(calls(docker_client, d, "pegasus.py export")) == 1


def test_daemon_killed_while_writing_an_entry_never_hits_the_half_entry(cache_daemon: Any, docker_client: Any,
                                                                        tmp_path: Path,
                                                                        det_inputs: dict[str, Any]) -> None:
    """SIGKILL while a 150 MB NBG is copied into the cache: no entry under the key; after the restart the job goes on
    in its attempt (a miss: no step runs again, its export's NBG is stored), the leftover is swept and the entry is
    complete."""
    d = cache_daemon()
    cache = d.state_dir / "cache"

    def entries() -> set[str]:
        return {p.name for p in cache.iterdir() if not p.name.startswith(".")} if cache.is_dir() else set()

    def caught_mid_copy(name: str, seed: int, before: set[str]) -> bool:
        """Drop `name` and freeze the daemon (SIGSTOP: it copies in its own process) once its entry's temporary
        folder is there and the entry is not; False when the copy ended unseen (a descheduled test), the job done."""
        drop(d.inbox, name, yolox(tmp_path / f"{name}.onnx", size=(64, 64), seed=seed), det_inputs["manifest"])
        deadline = time.monotonic() + 60
        while not (cache.is_dir() and any(p.name.startswith(".tmp-") for p in cache.iterdir())):
            assert time.monotonic() < deadline, d.stderr()[-2000:]
            if entries() - before:
                break
            time.sleep(0.002)  # the copy takes a few hundred ms: react well within it
        else:
            d.signal(signal.SIGSTOP)
            if not entries() - before:
                return True
            d.signal(signal.SIGCONT)
        assert d.wait_job(name)["state"] == "succeeded"
        return False

    before: set[str] = set()
    for tries, name in enumerate(("bignbg", "bignbg_again", "bignbg_third")):
        if caught_mid_copy(name, tries, before):
            break
        before = entries()
    else:
        pytest.fail("three copies of a 150 MB NBG ended before the test saw them under way")
    d.signal(signal.SIGKILL)
    d.proc.wait(10)
    assert entries() == before and [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    d.start()
    done = d.wait_job(name, timeout=120)
    assert done["state"] == "succeeded" and done["attempt"] == 1 and done["cache"]["hit"] is False
    assert len([c for c in calls(docker_client, d, "pegasus.py export") if done["job_id"] in c]) == 1
    # besides the locks and the report's emulated models (compile/emulated.py), the entries, whole
    assert entries() == before | {done["cache"]["key"]}
    assert not [p for p in cache.iterdir() if p.name.startswith(".") and p.name not in (".locks", ".emulated")]


def test_rebuilt_compiler_image_misses(tmp_path: Path, docker_config: Path, docker_client: Any, capsys: Any,
                                       det_inputs: dict[str, Any]) -> None:
    """The same compile hits on the same image; after the image is rebuilt (new ID under the same tag) it misses,
    the container follows the new image and the checkpoint's toolchain names it."""
    tag = f"saigeedged-standin/acuity:rebuilt-{uuid.uuid4().hex[:8]}"  # never another run's (one engine, many runs)

    def build() -> str:
        subprocess.run([str(IMAGES / "build.sh"), tag, str(IMAGES / "common"), str(IMAGES / "acuity")], check=True,
                       stdout=subprocess.DEVNULL)
        return str(docker_client.images.get(tag).id)

    data = yaml.safe_load(docker_config.read_text())
    data["cubie"]["image"] = tag
    docker_config.write_text(yaml.safe_dump(data))
    out = tmp_path / "det.saigeedge"
    mf = manifest(tmp_path / "det.yml", **det_inputs["manifest"], onnx=str(det_inputs["onnx"]), output=str(out))

    def compile_() -> tuple[str, dict[str, Any]]:
        assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
        with zipfile.ZipFile(out) as zf:
            return capsys.readouterr().out, yaml.safe_load(zf.read("checkpoint.yaml"))

    built: list[str] = []
    try:
        built.append(build())
        first, ckpt1 = compile_()
        again, _ = compile_()
        built.append(build())
        rebuilt, ckpt2 = compile_()
    finally:
        docker_client.containers.get(data["cubie"]["container"]).remove(force=True)
        for image_id in built:
            docker_client.images.remove(image_id, force=True)
    old_id, new_id = built
    assert old_id != new_id and "cache hit" not in first and "cache hit" in again and "cache hit" not in rebuilt
    versions = {"acuity": "6.30.22", "vivante_ide": "5.11.0"}
    assert ckpt1["toolchain"] == {"image": tag, "image_id": old_id, **versions}
    assert ckpt2["toolchain"] == {"image": tag, "image_id": new_id, **versions}
    assert ckpt2["cache_key"] != ckpt1["cache_key"]


def test_check_warns_about_optimize_targets_the_image_lacks(tmp_path: Path, docker_config: Path,
                                                            fresh_acuity: str) -> None:
    """`check` lists the --optimize targets of the image's VIV SDK cfg files, the one each platform gets, and warns
    for each optimize: override in the queue that is not among them (here: an SDK without _PLUS_ names, whose
    non-_PLUS_ spellings serve every platform)."""
    from saigeedged.adapters.store import Store
    from saigeedged.jobs import Job

    data = yaml.safe_load(docker_config.read_text())
    data["cubie"].update(image=fresh_acuity, viv_sdk="/root/Vivante_IDE/VivanteIDE5.8.2/cmdtools")
    docker_config.write_text(yaml.safe_dump(data))
    config = configmod.load(docker_config)
    store = Store(config.state_dir / "saigeedged.db")
    store.add(Job("x-1", "x", "cubie", "detection", {"optimize": "VIP9000NANODI_PLUS_PID0X1000003B"}, "", "/c", "x.yml"))
    store.add(Job("y-1", "y", "cubie", "detection", {"optimize": "VIP9000PICO_PID0XEE"}, "", "/c", "y.yml"))
    store.close()
    from saigeedged.cli import readiness

    out = io.StringIO()
    readiness.main(config, out)
    text = out.getvalue()
    assert "--optimize targets VIP9000NANODI_PID0X1000003B, VIP9000NANOSI_PID0X10000016, VIP9000PICO_PID0XEE" in text
    assert "ok    optimize     a733 -> VIP9000NANODI_PID0X1000003B, t527 -> VIP9000NANOSI_PID0X10000016, " \
           "a527 -> VIP9000NANOSI_PID0X10000016, v853 -> VIP9000PICO_PID0XEE" in text
    warned = [line for line in text.splitlines() if line.startswith("warn  optimize")]
    assert len(warned) == 1 and "optimize: VIP9000NANODI_PLUS_PID0X1000003B (a manifest override" in warned[0]
    assert "ok    versions     ACUITY 6.30.22, VivanteIDE 5.8.2" in text


def test_a_failed_compile_is_never_cached(tmp_path: Path, docker_config: Path, capsys: Any,
                                          det_inputs: dict[str, Any]) -> None:
    """An export that fails leaves no entry: the same compile runs the compiler again and fails again."""
    from saigeedged.adapters.cache import for_config

    onnx = yolox(tmp_path / "fatal65280.onnx", size=(64, 64))
    mf = manifest(tmp_path / "fatal65280.yml", **det_inputs["manifest"], onnx=str(onnx),
                  output=str(tmp_path / "f.saigeedge"))
    for _ in range(2):
        assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 1
        out = capsys.readouterr().out
        assert "EXPORT_FAILED" in out and "cache hit" not in out and "export" in out
    assert for_config(configmod.load(docker_config)).entries() == []
