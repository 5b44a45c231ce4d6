"""The Docker seam (SPEC §11, docs/spec-executor-slurm.md): `engines:` validated at load (local engines only: remote
ones are refused with a pointer to executor slurm), `connect` naming an engine it cannot reach, entry-point probes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import STANDIN_MOBILINT, write_config

from saigeedged import config as configmod
from saigeedged.adapters.docker import Engine, connect
from saigeedged.engines import DEFAULT, LOCAL, EngineSpec
from saigeedged.errors import SaigeError

PEGASUS = "/root/acuity-toolkit-whl-6.30.22/bin/pegasus.py"


def load(tmp_path: Path, engines: Any) -> configmod.Config:
    return configmod.load(write_config(tmp_path, engines=engines))


def test_no_engines_key_is_one_local_engine(tmp_path: Path) -> None:
    """Without `engines:` the daemon has one engine, `local`, found as docker.from_env() finds it, serving both targets."""
    (spec,) = load(tmp_path, []).engines
    assert spec == EngineSpec(LOCAL, None, ("cubie", "mobilint"))


@pytest.mark.parametrize("url", ["ssh://saige@compile2", "tcp://compile3:2376"])
def test_a_remote_engine_is_refused_pointing_to_executor_slurm(tmp_path: Path, url: str) -> None:
    """An ssh:// or tcp:// engine (the retired home-made pool) fails at load, naming the item and `executor: slurm`."""
    with pytest.raises(SaigeError) as err:
        load(tmp_path, [{"name": "local", "url": "unix:///var/run/docker.sock"}, {"name": "compile2", "url": url}])
    assert err.value.code == "MANIFEST_INVALID"
    assert "engines[1].url: remote engines" in err.value.message and "executor: slurm" in err.value.message
    assert err.value.message.startswith(f"config {tmp_path}")  # which file (it named none)
    assert "spec-executor-slurm" in err.value.hint


@pytest.mark.parametrize("engines, field", [
    ([{"name": "a", "url": "unix:///s"}, {"name": "b", "url": "http://x"}], "engines[1].url"),
    ([{"name": "a", "url": "unix:///s", "tls": {"ca": "a", "cert": "b", "key": "c"}}], "engines[0]"),
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
    assert f"saigeedged.yml: {field}" in err.value.message  # the file, then the field
    assert "engines:" in err.value.hint or "executor" in err.value.hint


def test_unreachable_engine_is_docker_unavailable_naming_it(tmp_path: Path) -> None:
    """connect() to an engine whose socket is missing says DOCKER_UNAVAILABLE with the engine's name and url."""
    spec = EngineSpec("gone", f"unix://{tmp_path}/none.sock", ("cubie",))
    with pytest.raises(SaigeError) as err:
        connect(spec, 5)
    assert err.value.code == "DOCKER_UNAVAILABLE"
    assert "engine gone (unix://" in err.value.message


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


def test_a_remote_docker_host_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """DOCKER_HOST in the service's environment naming another host's engine is not followed (issue 27 retired remote
    engines): DOCKER_UNAVAILABLE naming the variable, from connect, so from `check` and from each job."""
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    with pytest.raises(SaigeError) as err:
        connect(DEFAULT, 5)
    assert err.value.code == "DOCKER_UNAVAILABLE" and "DOCKER_HOST='tcp://127.0.0.1:2375'" in err.value.message
    assert "unset DOCKER_HOST" in err.value.hint


@pytest.mark.docker
def test_the_local_engine_is_never_a_docker_cli_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Docker CLI context current for the service's user (`docker context use`) naming a remote engine is not
    followed, as docker-py's from_env() would: the local engine is this host's socket."""
    import hashlib
    import json

    meta = tmp_path / "docker" / "contexts" / "meta" / hashlib.sha256(b"elsewhere").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": "elsewhere", "Metadata": {},
                                                "Endpoints": {"docker": {"Host": "tcp://127.0.0.1:9"}}}))
    (tmp_path / "docker" / "config.json").write_text(json.dumps({"currentContext": "elsewhere"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    client = connect(DEFAULT, 5)  # port 9 (discard) is closed here: the context's engine would refuse
    assert client.ping() and client.info()["ID"]
