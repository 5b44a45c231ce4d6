"""The cubie pipeline against a real Docker engine and the stand-in ACUITY image (SPEC §6, §9)."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import STANDIN_ACUITY
from docker.types import Mount
from factory import manifest, random_labels, valjson, yolox
from harness import container_output

from saigeedged import config as configmod
from saigeedged.cli import main as cli

pytestmark = pytest.mark.docker


def setup_det(tmp_path: Path, name: str = "best", **fields: object) -> Path:
    yolox(tmp_path / f"{name}.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(10, 3))
    return manifest(tmp_path / f"{name}.yml", task="detection", num_classes=3, calib=str(calib),
                    output=str(tmp_path / "out" / f"{name}.saigeedge"), **fields)


def compile_(mf: Path, config: Path, *extra: str) -> int:
    return cli.main(["compile", str(mf), "-c", str(config), *extra])


def container(client: Any, config: Path) -> Any:
    return client.containers.get(configmod.load(config).section("cubie")["container"])


def test_detector_compiles_to_an_a733_bundle(tmp_path: Path, docker_config: Path, docker_client: Any) -> None:
    """A YOLOX export + val.json gives a bundle with detection_yolox, the stride shapes, mean/scale and an A733 NBG."""
    mf = setup_det(tmp_path)
    assert compile_(mf, docker_config) == 0
    with zipfile.ZipFile(tmp_path / "out" / "best.saigeedge") as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        nbg = zf.read("best_surgery.nb")
    assert ckpt["task"] == "detection_yolox" and ckpt["target"] == "cubie" and ckpt["model"] == "best_surgery.nb"
    assert ckpt["output_shapes"] == [[1, 8, 8, 8], [1, 8, 4, 4], [1, 8, 2, 2]]
    assert ckpt["mean"] == [0.0, 0.0, 0.0] and ckpt["scale"] == [pytest.approx(1 / 255)] * 3
    assert ckpt["platform"] == {"name": "a733", "optimize": "VIP9000NANODI_PLUS_PID0X1000003B", "optimize_source": "image",
                                "optimize_candidates": ["VIP9000NANODI_PLUS_PID0X1000003B", "VIP9000NANODI_PID0X1000003B"]}
    assert ckpt["quantization"]["algorithm"] == "moving_average" and ckpt["quantization"]["n_samples"] == 10
    assert ckpt["build"]["image"] == STANDIN_ACUITY and ckpt["build"]["image_id"].startswith("sha256:")
    assert ckpt["source"]["surgery"][0] == "/head/Concat_output_0"
    assert nbg[:4] == b"VPMN" and nbg[8:12] == bytes([0x3B, 0, 0, 0x10])
    ctr = container(docker_client, docker_config)
    work_root = str(tmp_path / "state" / "work")
    assert ctr.labels["io.saigeedge.managed"] == "1" and ctr.attrs["HostConfig"]["IpcMode"] == "host"
    assert ctr.attrs["HostConfig"]["Init"] is True
    assert any(m["Source"] == work_root == m["Destination"] for m in ctr.attrs["Mounts"])
    assert not list((tmp_path / "state" / "work").iterdir())  # work dir removed without keep_work


def test_container_is_reused_and_restarted(tmp_path: Path, docker_config: Path, docker_client: Any) -> None:
    """A second compile reuses the container; a stopped one is started, not recreated."""
    mf = setup_det(tmp_path)
    assert compile_(mf, docker_config) == 0
    first = container(docker_client, docker_config)
    first.stop(timeout=0)
    assert compile_(mf, docker_config) == 0
    again = container(docker_client, docker_config)
    assert again.id == first.id and again.status == "running"


def test_a_container_that_no_longer_sees_the_work_root_is_made_afresh(tmp_path: Path, docker_config: Path,
                                                                     docker_client: Any) -> None:
    """The state dir removed and made again while the container ran (cleaned by hand, a purge and a reinstall): the
    container's bind mount still holds the old, removed folder, where no new work dir appears, and every step failed
    "chdir to cwd ... no such file or directory" until someone removed it by hand. It is now made afresh, and a
    container that does see the work root is kept (test_container_is_reused_and_restarted)."""
    mf = setup_det(tmp_path)
    assert compile_(mf, docker_config) == 0
    first = container(docker_client, docker_config)
    shutil.rmtree(tmp_path / "state")
    assert compile_(mf, docker_config) == 0
    again = container(docker_client, docker_config)
    assert again.id != first.id and again.status == "running"
    assert not [p for p in (tmp_path / "state" / "work").iterdir()]  # the check's own file is not left behind


def test_a_foreign_container_that_no_longer_sees_the_work_root_is_named_and_left(
        tmp_path: Path, docker_config: Path, docker_client: Any, capsys: Any) -> None:
    """The same for a container saigeedged did not make (but with the mount): CONTAINER_FAILED naming the cause and
    what to do, exit 3, and it is left alone."""
    name = configmod.load(docker_config).section("cubie")["container"]
    root = tmp_path / "state" / "work"
    root.mkdir(parents=True)
    foreign = docker_client.containers.run(STANDIN_ACUITY, ["tail", "-f", "/dev/null"], name=name, detach=True,
                                           mounts=[Mount(str(root), str(root), type="bind")])
    shutil.rmtree(root)
    assert compile_(setup_det(tmp_path), docker_config) == 3
    err = capsys.readouterr().err
    assert "CONTAINER_FAILED" in err and f"does not see the work root {root}" in err and f"docker rm -f {name}" in err
    assert docker_client.containers.get(name).id == foreign.id


@pytest.mark.parametrize(("name", "fields", "code", "text"), [
    ("best", {"qtype": "int16"}, "QUANTIZE_NO_OUTPUT", "quantizer/qtype"),
    ("fatal65280", {}, "EXPORT_FAILED", "65280"),
    ("failimport", {}, "STEP_FAILED", "exited 1"),
    ("best", {"optimize": "VIP9000PICO_PID0XEE"}, "NBG_INVALID", "0xEE"),
])
def test_pegasus_failure_modes(tmp_path: Path, docker_config: Path, capsys: Any, name: str, fields: dict[str, Any],
                               code: str, text: str) -> None:
    """Each failure mode of the notes ends in its stable code with exit 1."""
    mf = setup_det(tmp_path, name, **fields)
    assert compile_(mf, docker_config) == 1
    out = capsys.readouterr().out
    assert f"FAIL  {name}: {code}" in out and text in out


def test_fatal_65280_hint(tmp_path: Path, docker_config: Path, capsys: Any) -> None:
    """Fatal 65280 carries the dtype hint of the guide's troubleshooting table."""
    assert compile_(setup_det(tmp_path, "fatal65280"), docker_config) == 1
    assert "dtype the target cannot take" in capsys.readouterr().out


def test_hung_step_times_out_and_leaves_nothing_running(tmp_path: Path, docker_config: Path, docker_client: Any,
                                                        capsys: Any) -> None:
    """A step past step_timeout_s is killed inside the container, reaped, and the job ends TIMEOUT."""
    config = Path(str(docker_config))
    data = yaml.safe_load(config.read_text())
    data["limits"]["step_timeout_s"] = 2
    config.write_text(yaml.safe_dump(data))
    assert compile_(setup_det(tmp_path, "hang"), config) == 1
    assert "FAIL  hang: TIMEOUT" in capsys.readouterr().out
    procs = container_output(container(docker_client, config), ["ps", "-o", "stat,args"])
    assert "sleep 100000" not in procs
    assert not [line for line in procs.splitlines() if line.split()[0] == "Z"], procs  # killed steps leave no zombies


def test_hybrid_promotes_worst_non_output_tensors(tmp_path: Path, docker_config: Path) -> None:
    """hybrid_topn ranks entropy.txt, skips @output tensors and exports from the .quantize.json."""
    mf = setup_det(tmp_path, hybrid_topn=2, hybrid_dtype="float16")
    assert compile_(mf, docker_config) == 0
    with zipfile.ZipFile(tmp_path / "out" / "best.saigeedge") as zf:
        quant = yaml.safe_load(zf.read("checkpoint.yaml"))["quantization"]
    assert quant["hybrid_layers"] == ["@Conv_1_2:out0", "@Sigmoid_3_4:out0"] and quant["hybrid_topn"] == 2


def test_keep_work_moves_the_work_dir(tmp_path: Path, docker_config: Path) -> None:
    """keep_work: the work dir lands in <output dir>/cubie_work_<stem>/ with the patched inputmeta."""
    data = yaml.safe_load(docker_config.read_text())
    data["keep_work"] = True
    docker_config.write_text(yaml.safe_dump(data))
    assert compile_(setup_det(tmp_path), docker_config) == 0
    kept = tmp_path / "out" / "cubie_work_best"
    meta = yaml.safe_load((kept / "best_surgery_inputmeta.yml").read_text())
    db = meta["input_meta"]["databases"][0]
    assert db["path"] == str(kept.parent.parent / "state" / "work" / db["path"].split("/")[-2] / "dataset.txt")
    assert db["ports"][0]["preprocess"]["preproc_node_params"]["add_preproc_node"] is True
    assert (kept / "wksp" / "best_surgery_uint8_nbg_unify" / "network_binary.nb").is_file()


def test_multi_model_failure_is_collected(tmp_path: Path, docker_config: Path, capsys: Any) -> None:
    """A compiler failure does not stop the other entries; exit 1 with a summary line per entry."""
    yolox(tmp_path / "ok.onnx")
    yolox(tmp_path / "failimport.onnx")
    calib = valjson(tmp_path / "data", random_labels(6, 3))
    common = {"task": "detection", "num_classes": 3, "calib": str(calib)}
    mf = manifest(tmp_path / "compile_models.yml", models=[
        {**common, "onnx": "failimport.onnx", "name": "first", "output": str(tmp_path / "a.saigeedge")},
        {**common, "onnx": "ok.onnx", "name": "second", "output": str(tmp_path / "b.saigeedge")}])
    assert compile_(mf, docker_config) == 1
    out = capsys.readouterr().out
    assert "FAIL  first: STEP_FAILED" in out and "OK    second" in out
    assert (tmp_path / "b.saigeedge").is_file() and not (tmp_path / "a.saigeedge").exists()


def test_foreign_container_is_never_removed(tmp_path: Path, docker_config: Path, docker_client: Any, capsys: Any) -> None:
    """A same-named container without the work-root mount, not ours: CONTAINER_FAILED, exit 3, left alone."""
    name = configmod.load(docker_config).section("cubie")["container"]
    foreign = docker_client.containers.create(STANDIN_ACUITY, ["tail", "-f", "/dev/null"], name=name)
    assert compile_(setup_det(tmp_path), docker_config) == 3
    assert "CONTAINER_FAILED" in capsys.readouterr().err
    assert docker_client.containers.get(name).id == foreign.id


def test_missing_image(tmp_path: Path, docker_config: Path, capsys: Any) -> None:
    """An image that is not loaded: IMAGE_NOT_FOUND with the docker load hint, exit 3."""
    data = yaml.safe_load(docker_config.read_text())
    data["cubie"]["image"] = "ubuntu-npu:v0.0.0-missing"
    docker_config.write_text(yaml.safe_dump(data))
    assert compile_(setup_det(tmp_path), docker_config) == 3
    err = capsys.readouterr().err
    assert "IMAGE_NOT_FOUND" in err and "docker load -i" in err
    assert cli.main(["check", "-c", str(docker_config)]) == 3


def test_check_reports_a_ready_host(tmp_path: Path, docker_config: Path, capsys: Any) -> None:
    """check lists docker, the image, the pegasus entry point and the VIV SDK target configs."""
    assert cli.main(["check", "-c", str(docker_config)]) == 0
    out = capsys.readouterr().out
    assert "acuity-toolkit-whl-6.30.22/bin/pegasus.py" in out
    assert "VIP9000NANODI_PLUS_PID0X1000003B" in out and "VIP9000PICO_PID0XEE" in out


def test_dry_run_never_talks_to_docker(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """--dry-run validates and explains with no Docker engine reachable."""
    import os

    mf = setup_det(tmp_path)
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent.sock")
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "saigeedged", "compile", str(mf), "--dry-run", "-c", str(config_path)],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "steps       validate surgery calibration import" in run.stdout and "nothing compiled" in run.stdout


def test_job_timeout_bounds_the_steps(tmp_path: Path, docker_config: Path, capsys: Any) -> None:
    """limits.job_timeout_s caps each step at the time left: a slow job in a 1 s budget ends TIMEOUT."""
    data = yaml.safe_load(docker_config.read_text())
    data["limits"]["job_timeout_s"] = 1
    docker_config.write_text(yaml.safe_dump(data))
    assert compile_(setup_det(tmp_path, "slow"), docker_config) == 1
    assert "FAIL  slow: TIMEOUT" in capsys.readouterr().out


def test_compile_waits_for_the_container_lock(tmp_path: Path, docker_config: Path) -> None:
    """A one-shot compile next to a job holding the container waits for the lock under state_dir, then runs."""
    import subprocess
    import sys

    from saigeedged.adapters.hostlock import HostLock

    lock = HostLock(tmp_path / "state", yaml.safe_load(docker_config.read_text())["cubie"]["container"])
    lock.acquire()
    mf = setup_det(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "saigeedged", "compile", str(mf), "-c", str(docker_config)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "waiting for the container lock" in line:
            break
    assert proc.poll() is None and not (tmp_path / "out" / "best.saigeedge").exists()
    lock.release()
    assert proc.wait(60) == 0 and (tmp_path / "out" / "best.saigeedge").is_file()
