"""The Docker seam. STUB of w11-surfaces until w11-pool's seam lands: replaced by theirs at merge."""

from __future__ import annotations

import os
from typing import Any

import docker
import docker.tls

from saigeedged.engines import EngineSpec


def connect(spec: EngineSpec, timeout_s: float) -> Any:
    """A docker-py client for the engine (not pinged): the environment's CA bundle and proxies are not used."""
    if spec.url is None:
        return docker.from_env(timeout=int(timeout_s))
    tls: Any = False
    if spec.tls is not None:
        tls = docker.tls.TLSConfig(client_cert=(str(spec.tls.cert), str(spec.tls.key)), ca_cert=str(spec.tls.ca), verify=True)
    saved = {k: os.environ.pop(k) for k in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE") if k in os.environ}
    try:
        client = docker.DockerClient(base_url=spec.url, tls=tls, timeout=int(timeout_s), use_ssh_client=False)
    finally:
        os.environ.update(saved)
    client.api.trust_env = False
    return client
