"""The Docker seam (SPEC §11): `engines:` validated at load, `connect` over unix, tcp+TLS and ssh, and a remote
engine's container without mounts that gets its work dir by put_archive and gives its outputs by get_archive."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT, write_config

from saigeedged import config as configmod
from saigeedged.adapters.docker import Engine, connect
from saigeedged.engines import LOCAL, EngineSpec, TLSFiles
from saigeedged.errors import SaigeError

PEGASUS = "/root/acuity-toolkit-whl-6.30.22/bin/pegasus.py"


def load(tmp_path: Path, engines: Any) -> configmod.Config:
    return configmod.load(write_config(tmp_path, engines=engines))


def test_no_engines_key_is_one_local_engine(tmp_path: Path) -> None:
    """Without `engines:` the daemon has one engine, `local`, found as docker.from_env() finds it, serving both targets."""
    (spec,) = load(tmp_path, []).engines
    assert spec == EngineSpec(LOCAL, None, None, ("cubie", "mobilint"))
    assert spec.local


def test_engines_parse_with_tls_relative_to_the_config(tmp_path: Path) -> None:
    """Each item becomes an EngineSpec; tls files are relative to the config file; only unix engines are local."""
    specs = load(tmp_path, [
        {"name": "local", "url": "unix:///var/run/docker.sock"},
        {"name": "compile2", "url": "ssh://saige@compile2", "targets": ["cubie"]},
        {"name": "compile3", "url": "tcp://compile3:2376", "tls": {"ca": "ca.pem", "cert": "c.pem", "key": "k.pem"}}]).engines
    assert [(s.name, s.local, s.targets) for s in specs] == [
        ("local", True, ("cubie", "mobilint")), ("compile2", False, ("cubie",)), ("compile3", False, ("cubie", "mobilint"))]
    assert specs[2].tls == TLSFiles(tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem")


@pytest.mark.parametrize("engines, field", [
    ([{"name": "a", "url": "unix:///s"}, {"name": "b", "url": "http://x"}], "engines[1].url"),
    ([{"name": "a", "url": "ssh://x", "tls": {"ca": "a", "cert": "b", "key": "c"}}], "engines[0].tls"),
    ([{"name": "a", "url": "tcp://x:2376", "tls": {"ca": "a"}}], "engines[0].tls"),
    ([{"name": "a", "url": "unix:///s"}, {"name": "a", "url": "unix:///t"}], "engines[1].name"),
    ([{"name": "a", "url": "unix:///s", "targets": ["host"]}], "engines[0].targets"),
    ([{"name": "a", "url": "unix:///s", "targts": ["cubie"]}], "engines[0]"),
    (["unix:///s"], "engines[0]"),
])
def test_bad_engine_fails_at_load_naming_the_field(tmp_path: Path, engines: Any, field: str) -> None:
    """A bad `engines:` item is MANIFEST_INVALID when the config loads, naming the item and field, with a hint."""
    with pytest.raises(SaigeError) as err:
        load(tmp_path, engines)
    assert err.value.code == "MANIFEST_INVALID"
    assert f"config {field}" in err.value.message
    assert "engines:" in err.value.hint


def test_unreachable_engine_is_docker_unavailable_naming_it(tmp_path: Path) -> None:
    """connect() to an engine whose socket is missing says DOCKER_UNAVAILABLE with the engine's name and url."""
    spec = EngineSpec("gone", f"unix://{tmp_path}/none.sock", None, ("cubie",))
    with pytest.raises(SaigeError) as err:
        connect(spec, 5)
    assert err.value.code == "DOCKER_UNAVAILABLE"
    assert "engine gone (unix://" in err.value.message


def as_spec(entry: dict[str, Any], config_dir: Path) -> EngineSpec:
    """The EngineSpec the daemon would build from the test engine's `engines:` item."""
    path = config_dir / "engines.yml"
    path.write_text(yaml.safe_dump({"engines": [entry]}))
    return configmod.load(path).engines[0]


@pytest.mark.engines
@pytest.mark.docker
@pytest.mark.parametrize("via, engine", [("unix", "tls"), ("tls", "tls"), ("ssh", "ssh")])
def test_connect_reaches_each_transport(engine_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        via: str, engine: str) -> None:
    """connect() answers over unix, tcp+TLS (despite a CA bundle in the environment) and ssh, on that engine only."""
    host = engine_hosts[engine]
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "not-the-engines-ca.pem"))
    if via == "ssh":
        monkeypatch.setenv("HOME", str(host.ssh.home))  # paramiko's key and known_hosts, as the service user's
    client = connect(as_spec(host.config_entry(via), tmp_path), 30)
    try:
        assert client.ping()
        assert client.info()["Name"] == host.client().info()["Name"]
    finally:
        client.close()


@pytest.fixture
def remote(engine_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Any]]:
    """The tls test engine as a daemon's remote Engine, with containers unique to this test (removed after)."""
    host = engine_hosts["tls"]
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    names = {"cubie": f"saige-seam-cubie-{uuid.uuid4().hex[:8]}", "mobilint": f"saige-seam-mob-{uuid.uuid4().hex[:8]}"}
    config = configmod.load(write_config(tmp_path, cubie={"image": STANDIN_ACUITY, "container": names["cubie"]},
                                         mobilint={"image": STANDIN_MOBILINT, "container": names["mobilint"]},
                                         engines=[host.config_entry("tls")]))
    engine = Engine(config.engines[0], config)
    yield engine, config
    engine.close()
    for name in names.values():
        try:
            host.client().containers.get(name).remove(force=True)
        except Exception:  # never made, or already gone
            pass


@pytest.mark.engines
@pytest.mark.docker
def test_remote_container_has_no_mounts_and_copies_the_work_dir(remote: tuple[Engine, Any], engine_hosts: Any) -> None:
    """On a tcp engine the container has no mount; a step sees the host's work dir and its outputs come back."""
    engine, config = remote
    container = engine.container("cubie")
    ctr = container.ensure()
    assert engine_hosts["tls"].client().api.inspect_container(ctr.id)["Mounts"] == []
    work = config.work_root / "job-1"
    (work / "calib").mkdir(parents=True)
    model = bytes(range(256)) * 40
    (work / "det.onnx").write_bytes(model)
    (work / "calib" / "0001.jpg").write_bytes(b"jpeg")
    out: list[bytes] = []
    argv = ["python3", PEGASUS, "import", "onnx", "--model", "det.onnx", "--output-model", "det.json",
            "--output-data", "det.data"]
    assert container.run_step(argv, work, 60, out.append) == 0, b"".join(out)
    assert (work / "det.data").read_bytes() == model  # written by the step in the container, copied back
    assert b'"name": "det"' in (work / "det.json").read_bytes()
    (work / "det.json").write_text((work / "det.json").read_text() + " ")  # a host-side edit goes in again
    code = container.run_step(["sh", "-c", "cat det.json calib/0001.jpg > both.txt"], work, 60, out.append)
    assert code == 0
    assert (work / "both.txt").read_text().endswith(" jpeg")


@pytest.mark.engines
@pytest.mark.docker
def test_remote_copies_inputs_once_and_only_new_outputs_back(remote: tuple[Engine, Any]) -> None:
    """The calibration images go in with the first step only; a step that writes nothing copies nothing back, and a
    step's new file comes back without the unchanged inputs."""
    engine, config = remote
    container = engine.container("cubie")
    work = config.work_root / "job-2"
    work.mkdir(parents=True)
    (work / "calib.bin").write_bytes(b"\1" * 2_000_000)
    container.run_step(["true"], work, 60, lambda chunk: None)
    first = container.moved
    assert first >= 2_000_000
    container.run_step(["true"], work, 60, lambda chunk: None)
    assert container.moved == first
    container.run_step(["sh", "-c", "echo made > out.txt"], work, 60, lambda chunk: None)
    assert (work / "out.txt").read_text() == "made\n"
    assert 0 < container.moved - first < 64_000


@pytest.mark.docker
def test_an_entry_point_probe_that_finds_nothing_is_not_kept(tmp_path: Path) -> None:
    """A probe that finds no pegasus says what it saw and is run again for the next job: one probe cut short on a
    busy engine must not fail every later job of that container."""
    name = f"saige-seam-probe-{uuid.uuid4().hex[:8]}"
    config = configmod.load(write_config(tmp_path, cubie={"image": STANDIN_MOBILINT, "container": name}))
    engine = Engine(config.engines[0], config)
    try:
        container = engine.container("cubie")
        assert container.entry_point("pegasus", "command -v pegasus") == ""
        assert "probe exit 1" in container.probe_failure
        ctr = container.ensure()
        engine_api = connect(engine.spec, 30)
        exec_id = engine_api.api.exec_create(ctr.id, ["sh", "-c", "printf '#!/bin/sh\\n' > /bin/pegasus && "
                                                      "chmod +x /bin/pegasus"], user="root")["Id"]
        engine_api.api.exec_start(exec_id)
        assert container.entry_point("pegasus", "command -v pegasus") == "/bin/pegasus"
    finally:
        engine.close()
        connect(engine.spec, 30).containers.get(name).remove(force=True)
