"""A full state_dir (issue 17): the job database holds work, is never declared corrupt, and resumes when space returns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fullfs import fill, mounted

from saigeedged.adapters.store import CorruptDatabase, Store, StoreFull
from saigeedged.jobs import QUEUED, Job


def job(n: int) -> Job:
    return Job(job_id=f"a-{n}", name="a", target="host", task="mlc", entry={"onnx": "/x.onnx", "pad": "x" * 4000},
               subdir="", claim_dir=f"/c/{n}", manifest="x.yml", created_at="t")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs."""
    with mounted(tmp_path / "small", "2m") as folder:
        yield folder


def write_until_full(store: Store, start: int) -> int:
    """Add rows until the disk refuses one; the number of the refused one."""
    for n in range(start, start + 10_000):
        try:
            store.add(job(n))
        except StoreFull:
            return n
    raise AssertionError("the disk never filled up")


def test_a_full_state_dir_refuses_writes_then_resumes_with_every_row(small_fs: Path) -> None:
    """On a full disk each write raises StoreFull (again and again, never `cannot rollback`), a second open beside
    the first and a reopen are never CorruptDatabase, and once space returns every row is there and writes go on."""
    path = small_fs / "state" / "saigeedged.db"
    store = Store(path)
    for n in range(5):
        store.add(job(n))
    big = fill(small_fs)
    refused = write_until_full(store, 5)
    for _ in range(3):
        with pytest.raises(StoreFull):
            store.add(job(refused))
    with pytest.raises(StoreFull):
        store.take("a-0", "host", "t")
    assert store.get("a-0") == job(0)  # the refused take left the row queued
    for reopen in range(2):  # beside the open one (`status` while the daemon runs), then alone
        try:
            Store(path).close()
        except StoreFull:
            pass  # refusing to open while the disk is full is fine: it says so, and nothing is lost
        except CorruptDatabase as exc:  # the bug: a full disk is not a damaged file
            pytest.fail(f"declared corrupt on a full disk (open {reopen}): {exc}")
        if reopen == 0:
            store.close()
    big.unlink()
    store = Store(path)
    assert {j.job_id for j in store.in_state(QUEUED)} == {f"a-{n}" for n in range(refused)}
    store.add(job(refused))
    assert store.get(f"a-{refused}") == job(refused)
    assert store._rows("PRAGMA quick_check") == [("ok",)]


def test_opening_on_a_full_disk_is_store_full_never_corrupt(small_fs: Path) -> None:
    """A database closed cleanly, then its disk filled: opening it raises StoreFull (its -shm cannot be made), not
    CorruptDatabase (the `disk I/O error` that sent operators to move a healthy queue aside); with space it opens."""
    path = small_fs / "state" / "saigeedged.db"
    store = Store(path)
    for n in range(3):
        store.add(job(n))
    store.close()
    big = fill(small_fs)
    with pytest.raises(StoreFull, match=str(path)):
        Store(path)
    big.unlink()
    assert [j.job_id for j in Store(path).in_state(QUEUED)] == ["a-0", "a-1", "a-2"]


def test_a_damaged_page_is_found_at_open_only_after_an_unclean_close(tmp_path: Path) -> None:
    """A daemon killed (its -wal left over) on a database with a damaged page: the next open runs quick_check and
    says corrupt; an open that does not verify (a command beside a running daemon) does not read the whole file."""
    import subprocess
    import sys

    path = tmp_path / "saigeedged.db"
    code = ("import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]); from test_store_full import job;"
            " from saigeedged.adapters.store import Store; s = Store(Path(sys.argv[1]))\n"
            "for n in range(300): s.add(job(n))\n"
            "s._rows('PRAGMA wal_checkpoint(TRUNCATE)'); s.add(job(300)); os._exit(0)")  # killed: no clean close
    subprocess.run([sys.executable, "-c", code, str(path), str(Path(__file__).parent)], check=True, timeout=60)
    assert path.with_name(path.name + "-wal").exists()
    with path.open("r+b") as db:  # a page in the middle, as a failing disk would leave it
        db.seek(path.stat().st_size // 2 // 4096 * 4096)
        db.write(b"\xff" * 4096)
    with pytest.raises(CorruptDatabase, match="corrupt"):
        Store(path)
    Store(path, verify=False).close()


def test_a_workers_write_waits_for_room_and_lands_when_space_returns(small_fs: Path) -> None:
    """A write off the main loop on a full state_dir waits (the room callback asked again and again) and lands once
    space returns, so its job is never failed for it; the same write on the main loop raises StoreFull at once."""
    import threading

    from saigeedged.service.room import ROOM_POLL_S, Waiting

    store = Store(small_fs / "state" / "saigeedged.db")
    stop = threading.Event()
    room = Waiting(stop)
    store.wait_for_room = room
    big = fill(small_fs)
    refused = write_until_full(store, 0)
    with pytest.raises(StoreFull):  # the main loop's writes never wait: its next round tries again
        store.add(job(refused))
    assert room.status().endswith("state_dir full: waiting for space")
    landed = threading.Event()
    writer = threading.Thread(target=lambda: (store.add(job(refused + 1)), landed.set()), daemon=True)
    writer.start()
    assert not landed.wait(ROOM_POLL_S / 2)  # waiting, not failed
    big.unlink()
    assert landed.wait(ROOM_POLL_S * 4)
    assert store.get(f"a-{refused + 1}") == job(refused + 1)
    stop.set()
    writer.join(10)


def test_the_job_log_on_a_full_state_dir_drops_and_counts_never_fails(small_fs: Path) -> None:
    """Compiler output that a full state_dir refuses is dropped, not raised (the job goes on); once there is room the
    log says how many bytes were lost, then goes on."""
    from saigeedged.adapters.joblog import JobLog

    log = JobLog(small_fs / "logs" / "j.log")
    log.line("before")
    big = fill(small_fs)
    log.write(b"x" * 100_000)  # refused: no exception
    big.unlink()
    log.line("after")
    log.close()
    text = (small_fs / "logs" / "j.log").read_text()
    head, _, tail = text.rpartition("[")
    lost = int(tail.split(" bytes of output lost: state_dir was full]\n")[0])
    assert head.startswith("before\n") and head.count("x") + lost == 100_000 and lost > 0
    assert tail.endswith("state_dir was full]\nafter\n")


def test_a_worker_waits_for_room_on_disk_before_its_job_goes_on(small_fs: Path) -> None:
    """A job whose host steps found state_dir full waits until a file fits there again (said once, then polled),
    instead of being failed or requeued in a loop."""
    import threading

    from saigeedged.service.room import ROOM_POLL_S, Waiting, wait_for_disk

    stop = threading.Event()
    big = fill(small_fs)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (wait_for_disk(small_fs, Waiting(stop), "calibration"), done.set()),
                              daemon=True)
    waiter.start()
    assert not done.wait(ROOM_POLL_S / 2)  # no room: still waiting
    big.unlink()
    assert done.wait(ROOM_POLL_S * 4)
    stop.set()
    waiter.join(10)
