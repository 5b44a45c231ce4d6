"""The one atomic write: a reader sees the old file or the whole new one, and a failure leaves no temp file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO

import pytest

from saigeedged import files


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    """A writer that fails half-way leaves `dest` as it was and removes its temp file."""
    dest = tmp_path / "status.json"
    dest.write_bytes(b"old")

    def fill(out: BinaryIO) -> None:
        out.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        files.atomic_write(dest, fill)
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_exclusive_never_replaces(tmp_path: Path) -> None:
    """With exclusive=True an existing name is refused (False) and kept; a free one is taken; no temp is left."""
    taken, free = tmp_path / "det.saigeedge", tmp_path / "other.saigeedge"
    taken.write_bytes(b"first job's")
    assert files.write_bytes(taken, b"second job's", exclusive=True) is False
    assert files.write_bytes(free, b"second job's", exclusive=True) is True
    assert taken.read_bytes() == b"first job's" and free.read_bytes() == b"second job's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["det.saigeedge", "other.saigeedge"]


def test_temp_names_are_hidden_and_recognised(tmp_path: Path) -> None:
    """The temp name is hidden (the inbox scan skips dot files), fits NAME_MAX, matches TEMP_NAME (recovery) and is
    new at every call."""
    names = []
    for _ in range(2):
        fd, path = files.open_temp(tmp_path / ("x" * 250 + ".saigeedge"))
        os.close(fd)
        names.append(path.name)
    assert all(n.startswith(".") and len(n) <= 255 and files.TEMP_NAME.match(n) for n in names)
    assert names[0] != names[1] and files.TEMP_NAME.match(".det.json.4242.tmp")


def test_copy_replaces_whole(tmp_path: Path) -> None:
    """copy_file replaces `dest` with the whole of `src`."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(b"new" * 100_000)
    dest.write_bytes(b"old")
    assert files.copy_file(src, dest)
    assert dest.read_bytes() == src.read_bytes()


def test_two_threads_publishing_one_name_each_get_their_own_bytes(tmp_path: Path) -> None:
    """Two threads publish different bundles to one output name at once: each returned path holds its own bytes."""
    import threading

    from saigeedged.adapters.outbox import Outbox

    outbox = Outbox(tmp_path / "outbox")
    for round_ in range(20):
        bundles = []
        for n in range(2):
            bundle = tmp_path / f"b{n}"
            bundle.write_bytes(bytes([n + 1]) * (1 << 20))
            bundles.append(bundle)
        start, results = threading.Barrier(2), {}

        def publish(n: int, bundles: list[Path] = bundles, start: threading.Barrier = start,
                    results: dict[int, dict[str, object]] = results, round_: int = round_) -> None:
            start.wait()
            results[n] = outbox.publish_bundle(bundles[n], Path(f"r{round_}/m.host.saigeedge"),
                                               f"m-20261201T000000Z-00000{n}")

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for n, result in results.items():
            assert (outbox.root / str(result["path"])).read_bytes() == bundles[n].read_bytes()
        assert len({str(r["path"]) for r in results.values()}) == 2
        assert sorted(p.name for p in (outbox.root / f"r{round_}").iterdir()) == sorted(
            Path(str(r["path"])).name for r in results.values())  # no temp file left behind


def test_a_compiler_output_is_read_only_as_a_regular_file_of_its_folder(tmp_path: Path) -> None:
    """What a step leaves where its output belongs is taken only as a regular file inside the attempt's folder: not a
    symbolic link (to any host path), a folder, nor a path that resolves outside it."""
    from saigeedged.files import written_inside

    work = tmp_path / "work" / "job" / "attempt1"
    (work / "sub").mkdir(parents=True)
    (work / "m.mxq").write_bytes(b"MXQ1")
    (tmp_path / "secret.db").write_bytes(b"passwords")
    (work / "link.mxq").symlink_to("../../../secret.db")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.mxq").write_bytes(b"x")
    (work / "away").symlink_to(tmp_path / "elsewhere")
    assert written_inside(work / "m.mxq", work) is None
    assert written_inside(work / "link.mxq", work) == "a symbolic link to ../../../secret.db"
    assert written_inside(work / "sub", work) == "not a regular file"
    assert written_inside(work / "none.mxq", work) == "missing"
    assert (written_inside(work / "away" / "x.mxq", work) or "").startswith("outside the attempt's folder")


def test_a_step_file_the_daemon_edits_is_never_a_link_it_follows(tmp_path: Path) -> None:
    """cubie's inputmeta patch (and the hybrid .quantize edit) read and write the file a step wrote: a symbolic link
    a step left there to a host file is neither read nor written through (STEP_FAILED), a real file is replaced by
    rename with the change."""
    from saigeedged.compile.backends.steps import rewrite
    from saigeedged.errors import SaigeError

    work = tmp_path / "attempt1"
    work.mkdir()
    host = tmp_path / "saigeedged.db"
    host.write_text("passwords")
    (work / "m_inputmeta.yml").symlink_to("../saigeedged.db")
    with pytest.raises(SaigeError) as refused:
        rewrite(work / "m_inputmeta.yml", work, lambda text: "overwritten")
    assert refused.value.code == "STEP_FAILED" and "symbolic link to ../saigeedged.db" in refused.value.message
    assert "m_inputmeta.yml is a symbolic link" in refused.value.message
    assert host.read_text() == "passwords"
    (work / "m.quantize").write_text("a: 1\n")
    rewrite(work / "m.quantize", work, lambda text: text + "b: 2\n")
    assert (work / "m.quantize").read_text() == "a: 1\nb: 2\n"


def test_an_output_swapped_for_a_link_after_its_check_is_not_read(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle and the cache read an output through the file they checked: a link a step swaps in after
    written_inside looked (the next job's step shares the work root while this one is bundled) is refused at the
    open (O_NOFOLLOW), never followed to the host file."""
    work = tmp_path / "attempt1"
    work.mkdir()
    (tmp_path / "saigeedged.db").write_text("passwords")
    (work / "m.mxq").symlink_to("../saigeedged.db")
    monkeypatch.setattr(files, "written_inside", lambda path, root: None)  # the check ran before the swap
    with pytest.raises(files.NotOutput) as refused:
        files.open_output(work / "m.mxq", work)
    assert "m.mxq is not a file to read" in str(refused.value)
    monkeypatch.undo()
    (work / "real.mxq").write_bytes(b"MXQ1")
    with files.open_output(work / "real.mxq", work) as fh:
        assert fh.read() == b"MXQ1"


def test_a_marker_is_never_written_through_a_link_a_step_put_there(tmp_path: Path) -> None:
    """write_in (a cancel's stop file in a folder compiler steps write): a link planted under the marker's name is
    replaced, its target untouched; a folder that is a link is refused; remove_in takes the link, not its target."""
    target = tmp_path / "state.db"
    target.write_bytes(b"precious")
    work = tmp_path / "attempt1"
    work.mkdir()
    (work / ".step.stop").symlink_to(target)
    files.write_in(work, ".step.stop", b"cancel")
    assert target.read_bytes() == b"precious"
    assert not (work / ".step.stop").is_symlink() and (work / ".step.stop").read_bytes() == b"cancel"
    (tmp_path / "variant1").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(OSError):
        files.write_in(tmp_path / "variant1", ".step.stop", b"cancel")
    assert not (tmp_path / "elsewhere" / ".step.stop").exists()
    (work / ".step.stop").unlink()
    (work / ".step.stop").symlink_to(target)
    files.remove_in(work, ".step.stop")
    assert target.read_bytes() == b"precious" and not (work / ".step.stop").exists()


def test_the_start_up_sweep_never_takes_a_temp_file_being_written(tmp_path: Path) -> None:
    """The sweep of leftover temp files runs beside the daemon's first writes: sweeping the folder over and over while
    3,000 writes go on fails none of them (a temp file taken between its making and its entry in WRITING failed its
    write: 5 in 3,000 so, before), a leftover goes, one gone already is not reported removed."""
    stop, failed = threading.Event(), []

    def sweep() -> None:
        while not stop.is_set():
            for name in os.listdir(tmp_path):
                if files.TEMP_NAME.match(name):
                    files.remove_leftover(tmp_path / name)

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    try:
        for _ in range(3000):
            try:
                files.atomic_write(tmp_path / "job.json", lambda out: out.write(b"{}"))
            except OSError as exc:
                failed.append(exc)
    finally:
        stop.set()
        sweeper.join()
    assert failed == [] and (tmp_path / "job.json").read_bytes() == b"{}"
    left = tmp_path / ".job.json.k1ll3d00.tmp"
    left.write_bytes(b"{")
    assert files.remove_leftover(left) and not left.exists()
    assert not files.remove_leftover(left)


def test_a_bundle_placed_in_a_folder_that_refuses_its_fsync_is_published_once(tmp_path: Path) -> None:
    """A write-only drop folder on the share (-wx for the daemon): the bundle's rename into it works, the folder's
    fsync cannot open it. The bundle is placed, so publishing says so (it raised PUBLISH_FAILED, and the retry placed
    a second copy, det.<job>.saigeedge). The daemon's process here is root without the capabilities that pass over a
    folder's mode bits, as a service's user is."""
    bundle, models = tmp_path / "det.saigeedge", tmp_path / "models"
    bundle.write_bytes(b"bundle")
    models.mkdir()
    models.chmod(0o300)  # rename in, never list (open)
    script = ("import json, sys; from pathlib import Path; from saigeedged.adapters.outbox import Outbox\n"
              "root = Path(sys.argv[1])\n"
              "for _ in range(2):  # the second is what a retry of a failed publish does\n"
              "    try:\n"
              "        print(json.dumps(Outbox(root).publish_bundle(root / 'det.saigeedge', Path('models/det.saigeedge'),"
              " job_id='j1')))\n"
              "        break\n"
              "    except Exception as exc:\n"
              "        print(json.dumps({'error': str(exc)}))\n")
    run = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-c", script,
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    models.chmod(0o755)
    assert run.returncode == 0, run.stderr
    answers = [json.loads(line) for line in run.stdout.splitlines()]
    assert answers == [{"path": "models/det.saigeedge", "sha256": hashlib.sha256(b"bundle").hexdigest(), "bytes": 6}]
    assert [p.name for p in models.iterdir()] == ["det.saigeedge"]


def test_an_output_swapped_for_a_fifo_after_its_check_never_blocks_the_reader(tmp_path: Path) -> None:
    """A step swaps its output for a FIFO between the daemon's check and its open (the next job's step shares the work
    root): the open waited for a writer for ever, holding the bundling thread. Each read now gets the file or
    NotOutput, at once."""
    out = tmp_path / "network_binary.nb"
    out.write_bytes(b"nbg")
    stop, results = threading.Event(), []

    def swap() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            fifo, plain = tmp_path / f"f{n}", tmp_path / f"p{n}"
            os.mkfifo(fifo)
            os.replace(fifo, out)
            plain.write_bytes(b"nbg")
            os.replace(plain, out)

    def read() -> None:
        for _ in range(3000):
            try:
                with files.open_output(out) as fh:
                    results.append(fh.read())
            except files.NotOutput:
                results.append(None)

    swapper, reader = threading.Thread(target=swap), threading.Thread(target=read, daemon=True)
    swapper.start()
    reader.start()
    reader.join(30)
    stop.set()
    swapper.join()
    blocked = reader.is_alive()
    if blocked:  # give the stuck open its writer, so the thread ends
        os.close(os.open(out, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked and len(results) == 3000 and set(results) <= {b"nbg", None}
