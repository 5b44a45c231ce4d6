"""Vendor toolchains as they are (issue 20): the --optimize spelling the image has, versions, qb Compiler 1.3, FP16."""

from __future__ import annotations

import io
import json
import os
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import STANDIN_ACUITY, build_variant
from factory import classifier, manifest, random_labels, valjson, yolox
from harness import container_output

from saigeedged import config as configmod
from saigeedged.cli import main as cli
from saigeedged.cli import readiness
from saigeedged.compile.backends import cubie, mobilint
from saigeedged.manifest import Entry

PLUS, BARE = "VIP9000NANODI_PLUS_PID0X1000003B", "VIP9000NANODI_PID0X1000003B"
CFG = "/root/Vivante_IDE/VivanteIDE5.11.0/cmdtools/common/cfg"


def entry(**fields: Any) -> Entry:
    base = {"task": "detection", "num_classes": 3, "calib": Path("/c.json"), "onnx": Path("/m/best.onnx"),
            "stem": "best", "manifest": Path("/m/best.yml")}
    return Entry(**{**base, **fields})


@pytest.mark.parametrize(("fields", "warns"), [
    ({"hybrid_topn": 2}, True),  # hybrid_dtype defaults to float16
    ({"hybrid_topn": 2, "hybrid_dtype": "dynamic_fixed_point-i16"}, False),
    ({"quantizer": "float16", "qtype": "float16"}, True),
    ({"quantizer": "dynamic_fixed_point", "qtype": "int16"}, False),
    ({"hybrid_topn": 0}, False),
    ({"hybrid_topn": 2, "platform": "t527"}, False),
    ({"hybrid_topn": 2, "target": "host"}, False),
])
def test_fp16_warning_only_for_float16_layers_on_a733(fields: dict[str, Any], warns: bool) -> None:
    """The FP16 warning names the A733 slowdown and the int16 path, for float16 hybrid or whole-model layers."""
    found = cubie.precision_warnings(entry(**fields))
    assert bool(found) == warns
    assert not found or found[0].startswith("A733 runs FP16 ~29x slower than INT16: use qtype int16")


def test_compile_device_follows_the_image_tag_unless_configured() -> None:
    """auto: cpu for a `-cpu-` tag, gpu otherwise (qbcompiler's own default); cpu/gpu as configured."""
    assert mobilint.compile_device("auto", "mobilint/qbcompiler:1.3-cpu-ubuntu22.04") == "cpu"
    assert mobilint.compile_device("auto", "registry:5000/mobilint/qbcompiler:1.3-cuda12.8.1-ubuntu22.04") == "gpu"
    assert mobilint.compile_device("auto", "qbcompiler-cpu") == "gpu"  # a repository name is no tag
    assert mobilint.compile_device("gpu", "mobilint/qbcompiler:1.3-cpu-ubuntu22.04") == "gpu"


def test_parser_workers_default_to_the_cpus_minus_one() -> None:
    """0 means this host's CPUs minus one (at least 1); a positive setting is passed as it is."""
    assert mobilint.parser_workers(0) == max(1, (os.cpu_count() or 2) - 1)
    assert mobilint.parser_workers(3) == 3


def test_info_json_is_found_among_log_lines() -> None:
    """The JSON object info printed is read even with log lines before it; no object gives None."""
    assert mobilint.info_json(b'I loading\n{"format": "mblt", "bytes": 3}\n') == {"format": "mblt", "bytes": 3}
    assert mobilint.info_json(b"I nothing here\n[1, 2]\n") is None


@pytest.fixture(scope="module")
def acuity_variants(docker_client: Any) -> Iterator[dict[str, str]]:
    """Stand-in ACUITY images whose VIV SDK cfg holds only the _PLUS_ A733 config, only the bare one, or neither."""
    tag = uuid.uuid4().hex[:8]
    images = {"plus": build_variant(f"saigeedged-standin/acuity:plus-{tag}", "common", "acuity"),
              "bare": build_variant(f"saigeedged-standin/acuity:bare-{tag}", "common", "acuity", "acuity-nonplus"),
              "neither": build_variant(f"saigeedged-standin/acuity:neither-{tag}", "common", "acuity", "acuity-neither")}
    yield images
    for image in images.values():
        docker_client.images.remove(image, force=True)


def use_image(config: Path, section: str, image: str, **more: Any) -> dict[str, Any]:
    data = yaml.safe_load(config.read_text())
    data[section]["image"] = image
    for key, value in more.items():
        data.setdefault(key, {}).update(value)
    config.write_text(yaml.safe_dump(data))
    return data


def calls(docker_client: Any, container: str, what: str) -> list[str]:
    """The stand-in's record of its calls in that container (cwd, tool, argv), those containing `what`."""
    out = container_output(docker_client.containers.get(container), ["cat", "/tmp/standin-calls.log"])
    return [line for line in out.splitlines() if what in line]


def det(tmp_path: Path, **fields: Any) -> Path:
    onnx = yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(6, 3))
    return manifest(tmp_path / "det.yml", task="detection", num_classes=3, calib=str(calib), n_samples=4,
                    onnx=str(onnx), output=str(tmp_path / "det.saigeedge"), **fields)


@pytest.mark.docker
@pytest.mark.parametrize(("variant", "target"), [("plus", PLUS), ("bare", BARE)])
def test_a733_gets_the_spelling_the_image_has(tmp_path: Path, docker_config: Path, docker_client: Any,
                                              acuity_variants: dict[str, str], variant: str, target: str) -> None:
    """The export is passed the first A733 candidate whose .config the image has; the job log, checkpoint.yaml
    (platform and toolchain versions) and the compile say which one and how it was chosen."""
    data = use_image(docker_config, "cubie", acuity_variants[variant])
    assert cli.main(["compile", str(det(tmp_path)), "-c", str(docker_config)]) == 0
    exports = calls(docker_client, data["cubie"]["container"], "pegasus.py export")
    assert len(exports) == 1 and f"--optimize {target} --viv-sdk" in exports[0]
    with zipfile.ZipFile(tmp_path / "det.saigeedge") as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
    assert ckpt["platform"] == {"name": "a733", "optimize": target, "optimize_source": "image",
                                "optimize_candidates": [PLUS, BARE]}
    assert {k: ckpt["toolchain"][k] for k in ("acuity", "vivante_ide")} == {"acuity": "6.30.22", "vivante_ide": "5.11.0"}
    assert ckpt["toolchain"]["image"] == acuity_variants[variant]
    log = next((tmp_path / "state" / "logs").glob("*.log")).read_text()
    assert f"optimize: {target} (the first of {PLUS}, {BARE} with a .config in {CFG})" in log


@pytest.mark.docker
def test_an_image_with_neither_spelling_fails_before_any_compiler_step(
        tmp_path: Path, docker_config: Path, docker_client: Any, acuity_variants: dict[str, str], capsys: Any) -> None:
    """No A733 candidate in the image: CONTAINER_FAILED naming both candidates and the cfg folder, with a hint,
    and pegasus never ran."""
    data = use_image(docker_config, "cubie", acuity_variants["neither"])
    assert cli.main(["compile", str(det(tmp_path)), "-c", str(docker_config)]) == 3
    err = capsys.readouterr().err
    assert "CONTAINER_FAILED" in err and f"none of {PLUS}.config, {BARE}.config in {CFG}" in err
    assert "(it has VIP9000NANOSI_PLUS_PID0X10000016, VIP9000PICO_PID0XEE)" in err and "hint: set cubie.viv_sdk" in err
    assert calls(docker_client, data["cubie"]["container"], "pegasus.py") == []


@pytest.mark.docker
def test_the_manifest_optimize_is_passed_unprobed(tmp_path: Path, docker_config: Path, docker_client: Any,
                                                  acuity_variants: dict[str, str], capsys: Any) -> None:
    """`optimize:` wins without a look at the image: on the image with neither spelling the export gets it (and
    the stand-in's export, like pegasus, fails for a target without its .config)."""
    data = use_image(docker_config, "cubie", acuity_variants["neither"])
    assert cli.main(["compile", str(det(tmp_path, optimize=PLUS)), "-c", str(docker_config)]) == 1
    assert "STEP_FAILED" in capsys.readouterr().out
    exports = calls(docker_client, data["cubie"]["container"], "pegasus.py export")
    assert len(exports) == 1 and f"--optimize {PLUS} " in exports[0]
    log = next((tmp_path / "state" / "logs").glob("*.log")).read_text()
    assert f"optimize: {PLUS} (the manifest's optimize:, not looked up in the image)" in log


@pytest.mark.docker
def test_check_shows_versions_and_the_spelling_each_platform_gets(docker_config: Path, acuity_variants: dict[str, str],
                                                                  docker_client: Any) -> None:
    """check prints the ACUITY and VivanteIDE versions, the target each platform gets from this image, and the
    qb Compiler version, device and parser workers."""
    use_image(docker_config, "cubie", acuity_variants["bare"])
    out = io.StringIO()
    assert readiness.main(configmod.load(docker_config), out) == 0
    text = out.getvalue()
    print(text)  # shown in the closing note
    assert "ok    versions     ACUITY 6.30.22, VivanteIDE 5.11.0" in text
    assert f"ok    optimize     a733 -> {BARE}, t527 -> VIP9000NANOSI_PID0X10000016" in text
    assert "ok    versions     qb Compiler 1.3.0" in text and "qbcompiler --device gpu (mobilint.device auto)" in text


@pytest.fixture(scope="module")
def cpu_qbcompiler(docker_client: Any) -> Iterator[str]:
    """The stand-in qbcompiler under a CPU image tag, as mobilint/qbcompiler:1.3-cpu-ubuntu22.04 is."""
    tag = build_variant(f"saigeedged-standin/qbcompiler:1.3-cpu-{uuid.uuid4().hex[:8]}", "common", "mobilint")
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.mark.docker
def test_cpu_image_compiles_with_device_cpu_and_keeps_its_provenance(
        tmp_path: Path, docker_config: Path, docker_client: Any, cpu_qbcompiler: str) -> None:
    """A `-cpu-` image gets --device cpu on parse and quantize, MBLT_HL_PARSER_NUM_WORK as configured; the bundle
    holds the saved compiler config and the info JSON; checkpoint.yaml records the qb Compiler version."""
    data = use_image(docker_config, "mobilint", cpu_qbcompiler, limits={"mobilint_parser_workers": 2})
    classifier(tmp_path / "tags.onnx", 3, (224, 224))
    calib = valjson(tmp_path / "data", random_labels(5, 3))
    mf = manifest(tmp_path / "tags.yml", task="mlc", num_classes=3, calib=str(calib), target="mobilint",
                  device="regulus-rb", output=str(tmp_path / "tags.saigeedge"))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    container = data["mobilint"]["container"]
    parse, quantize = calls(docker_client, container, "qbcompiler parse"), calls(docker_client, container, "quantize")
    assert len(parse) == 1 and parse[0].endswith("--output tags.mblt --device cpu")
    assert len(quantize) == 1 and "--device cpu --config-save-path tags_config.yaml --config-preset classification" \
        in quantize[0]
    with zipfile.ZipFile(tmp_path / "tags.saigeedge") as zf:
        names = sorted(zf.namelist())
        saved = yaml.safe_load(zf.read("tags_config.yaml"))
        info = json.loads(zf.read("tags_info.json"))
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
    print(names)  # the mobilint bundle's members, for the closing note
    assert names == ["calib_digests.txt", "checkpoint.yaml", "tags.mxq", "tags_config.yaml", "tags_info.json"]
    assert saved["device"] == "cpu" and saved["parser_num_work"] == 2 and saved["target_device"] == "regulus-rb"
    assert info["format"] == "mblt" and info["file"] == "tags.mblt"
    assert ckpt["toolchain"]["qbcompiler"] == "1.3.0" and ckpt["toolchain"]["image"] == cpu_qbcompiler
    assert ckpt["quantization"]["compile_device"] == "cpu"


@pytest.mark.docker
def test_validate_and_the_daemon_warn_about_fp16_on_a733(tmp_path: Path, docker_config: Path, daemon: Any,
                                                         det_inputs: dict[str, Any], capsys: Any) -> None:
    """`validate` prints the FP16 warning; the daemon's validate step writes it to the job log and the journal
    (`job.warning`) and the job still succeeds."""
    from harness import drop

    m = {**det_inputs["manifest"], "target": "cubie", "hybrid_topn": 1}
    mf = manifest(tmp_path / "fp16.yml", **m, onnx=str(det_inputs["onnx"]))
    assert cli.main(["validate", str(mf), "-c", str(docker_config)]) == 0
    assert "warning     A733 runs FP16 ~29x slower than INT16" in capsys.readouterr().out
    settings = yaml.safe_load(docker_config.read_text())
    d = daemon(cubie=settings["cubie"], limits=settings["limits"])
    drop(d.inbox, "fp16", det_inputs["onnx"], m)
    job = d.wait_job("fp16", timeout=180)
    assert job["state"] == "succeeded", job
    warned = d.events("job.warning")
    assert len(warned) == 1 and warned[0]["job_id"] == job["job_id"] and warned[0]["step"] == "validate"
    assert "use qtype int16 / dynamic_fixed_point-i16 hybrid" in warned[0]["message"]
    assert "warning: A733 runs FP16 ~29x slower" in (d.outbox / "logs" / f"{job['job_id']}.log").read_text()


@pytest.mark.docker
@pytest.mark.timeout(120)  # before the fix: for ever
def test_a_probe_that_never_ends_gives_up_at_the_clients_deadline(docker_client: Any) -> None:
    """`check`'s throwaway probe container is waited for with the client's deadline and removed whatever happens:
    docker-py's containers.run waited without one, so a probe (or a dockerd) that never answered held `check` for
    ever."""
    import docker
    import requests

    from saigeedged.cli.engineprobe import run_probe

    image = docker_client.images.get(STANDIN_ACUITY)
    # the engine docker_client reaches, with a deadline short against the probe's 100000 s but long against a loaded
    # engine's create, start and remove of a container (each has the same deadline)
    client = docker.from_env(timeout=10)
    script = f"sleep 100000 # {uuid.uuid4().hex}"  # this test's own probe, among other tests' containers
    assert run_probe(client, image.id, "echo found") == "found"
    with pytest.raises(docker.errors.ContainerError):  # a failing probe raises, as containers.run made it
        run_probe(client, image.id, "echo not an answer; exit 3")
    with pytest.raises(requests.exceptions.ConnectionError):
        run_probe(client, image.id, script)
    left = [c for c in docker_client.containers.list(all=True) if c.attrs["Config"]["Cmd"] == ["sh", "-c", script]]
    assert not left, "the probe's container was left"
