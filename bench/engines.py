"""Benchmark of the extra test engines (not a test): cold bring-up time, and put/get_archive cost of calibration
images to an engine over unix, tcp+TLS and ssh. Prints JSON.

    .venv/bin/python bench/engines.py [--images 100] [--size-kb 100] [--repeat 3]

Needs root, the stand-in images (scripts/test builds them) and what scripts/setup-host installs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import docker  # noqa: E402
from conftest import STANDIN_ACUITY, build_standins  # noqa: E402
from enginehosts import STANDARD, started_engines  # noqa: E402


def calibration_tar(count: int, size: int) -> bytes:
    """`count` incompressible files of `size` bytes (JPEG-like) under calib/, as one tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(count):
            info = tarfile.TarInfo(f"calib/{i:04d}.jpg")
            info.size = size
            tar.addfile(info, io.BytesIO(os.urandom(size)))
    return buf.getvalue()


def timed(action: Callable[[], Any], repeat: int) -> float:
    """Median seconds of `repeat` runs."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def split(data: bytes) -> list[bytes]:
    """One tar per file of `data` (what a transfer file by file would send)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [calibration_tar_of(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]


def calibration_tar_of(name: str, content: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def transfer(client: docker.DockerClient, data: bytes, repeat: int) -> dict[str, float]:
    """put_archive of the whole tar, of each file alone, get_archive of the folder back; seconds and MB/s."""
    ctr = client.containers.create(STANDIN_ACUITY, name=f"saige-bench-{uuid.uuid4().hex[:8]}")
    singles = split(data)
    try:
        ctr.start()
        put = timed(lambda: client.api.put_archive(ctr.id, "/tmp", data), repeat)
        put_each = timed(lambda: [client.api.put_archive(ctr.id, "/tmp", one) for one in singles], repeat)
        get = timed(lambda: b"".join(client.api.get_archive(ctr.id, "/tmp/calib")[0]), repeat)
    finally:
        ctr.remove(force=True)
    mb = len(data) / 1e6
    return {"put_s": round(put, 3), "put_MBps": round(mb / put, 1), "put_file_by_file_s": round(put_each, 3),
            "get_s": round(get, 3), "get_MBps": round(mb / get, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--size-kb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    host = docker.from_env()
    build_standins(host)
    data = calibration_tar(args.images, args.size_kb * 1000)
    started = time.perf_counter()
    with started_engines(host, STANDARD) as hosts:
        result: dict[str, Any] = {"bring_up_s": round(time.perf_counter() - started, 2), "engines": len(STANDARD),
                                  "payload_MB": round(len(data) / 1e6, 2), "images": args.images}
        for via, engine in (("unix", "tls"), ("tls", "tls"), ("ssh", "ssh")):
            client = hosts[engine].client(via, timeout=120)
            result[via] = transfer(client, data, args.repeat)
            client.close()
        leaving = time.perf_counter()
    result["tear_down_s"] = round(time.perf_counter() - leaving, 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
