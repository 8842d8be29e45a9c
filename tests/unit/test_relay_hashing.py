"""The relay's hashing commands and stream verification, run by a local bash (no SSH): each
hash tool the host may have (python3, else openssl, else sha256sum; chosen on the host by
PATH) gives the same digest, the stream arrives whole, and the digests and the source's
stat are read back from what the ends print."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_ops.remote.priority import MARK as PRIORITY_MARK
from dflash_ops.staging.relay import Moved, RelayState, move
from dflash_ops.staging.relay_commands import (
    NO_HASHER,
    SOURCE_MARK,
    STAT_MARK,
    digest_in,
    hash_file,
    hash_stdin,
    sink,
    source_command,
    stderr_reason,
    stream_hashed,
)

PAYLOAD = os.urandom((3 << 20) + 12345)  # over one splice chunk, a multiple of nothing
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
BASICS = ("bash", "sh", "cat", "tee", "sed", "sync", "stat", "tail", "head", "dirname", "sleep")
TOOLSETS = {"python3": ("python3",), "openssl": ("openssl",), "sha256sum": ("sha256sum",)}


@pytest.fixture(params=list(TOOLSETS))
def hasher_path(request, tmp_path) -> str:
    """A PATH whose only hash tool is the parameter's: the command picks it on its own."""
    directory = tmp_path / f"bin-{request.param}"
    directory.mkdir()
    for name in (*BASICS, *TOOLSETS[request.param]):
        found = sys.executable if name == "python3" else shutil.which(name)
        assert found, name
        (directory / name).symlink_to(found)
    return str(directory)


def bash(command: str, path: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], input=stdin, capture_output=True, env={"PATH": path}
    )


def quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


@pytest.fixture
def source_file(tmp_path) -> Path:
    path = tmp_path / "source dir" / "check'point.pt"  # a space and a quote: quoting matters
    path.parent.mkdir()
    path.write_bytes(PAYLOAD)
    return path


def test_hash_stdin_and_hash_file_with_every_tool(hasher_path, source_file):
    assert digest_in(bash(hash_stdin(), hasher_path, PAYLOAD).stdout.decode()) == DIGEST
    assert digest_in(bash(hash_file(str(source_file)), hasher_path).stdout.decode()) == DIGEST


def test_stream_hashed_sends_the_bytes_and_their_digest_with_every_tool(hasher_path, source_file):
    done = bash(stream_hashed(f"cat -- {quoted(source_file)}"), hasher_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == PAYLOAD
    assert Moved(len(PAYLOAD), 0, done.stderr.decode(), 0, "", "").source_digest == DIGEST


def test_stream_hashed_reads_a_plain_file_itself(hasher_path, source_file):
    done = bash(stream_hashed(f"cat -- {quoted(source_file)}", str(source_file)), hasher_path)
    assert done.returncode == 0 and done.stdout == PAYLOAD
    assert f"{SOURCE_MARK} {DIGEST}" in done.stderr.decode()


def test_a_file_that_shrinks_while_it_is_sent_stops_the_source(source_file):
    """The python source sends a plain file with sendfile: a file cut short under it must end
    the stream with an error, not spin on a zero-byte send."""
    source = subprocess.Popen(
        ["bash", "-c", stream_hashed(f"cat -- {quoted(source_file)}", str(source_file))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = source.stdout.read(1 << 16)  # the source is inside its first 1 MiB chunk now
    os.truncate(source_file, 1 << 19)
    try:
        rest, errors = source.communicate(timeout=30)
    finally:
        source.kill()
    assert source.returncode != 0
    assert "the file shrank while read" in errors.decode() and SOURCE_MARK not in errors.decode()
    assert first + rest == PAYLOAD[: len(first + rest)] and len(first + rest) <= 1 << 19


def test_the_source_command_adds_the_stat_and_keeps_the_read_status(hasher_path, source_file):
    stat = f"stat -c '%s %Y %F' -- {quoted(source_file)}"
    read = f"cat -- {quoted(source_file)}"
    done = bash(source_command(read, stat, hashed=True, path=None), hasher_path)
    moved = Moved(len(done.stdout), done.returncode, done.stderr.decode(), 0, "", "")
    assert done.returncode == 0 and done.stdout == PAYLOAD and moved.source_digest == DIGEST
    assert moved.source_stat is not None and moved.source_stat.size == len(PAYLOAD)
    unhashed = bash(source_command(read, stat, hashed=False, path=None), hasher_path)
    assert unhashed.stdout == PAYLOAD and SOURCE_MARK not in unhashed.stderr.decode()
    failed = bash(source_command("cat -- /nonexistent", stat, hashed=True, path=None), hasher_path)
    assert failed.returncode != 0  # the read's failure, not the stat's success


def test_sink_writes_hashes_appends_and_truncates(hasher_path, tmp_path):
    target = tmp_path / "dest dir" / "it's.partial"
    target.parent.mkdir()
    first = bash(
        sink(str(target), append=False, hashed=True, stall_timeout=None),
        hasher_path,
        PAYLOAD[:1000],
    )
    assert first.returncode == 0, first.stderr
    assert digest_in(first.stdout.decode()) == hashlib.sha256(PAYLOAD[:1000]).hexdigest()
    rest = bash(
        sink(str(target), append=True, hashed=False, stall_timeout=None),
        hasher_path,
        PAYLOAD[1000:],
    )
    assert rest.returncode == 0 and "unhashed" in rest.stdout.decode()
    assert digest_in(rest.stdout.decode()) is None
    assert target.read_bytes() == PAYLOAD
    bash(sink(str(target), append=False, hashed=True, stall_timeout=None), hasher_path, b"short")
    assert target.read_bytes() == b"short"


@pytest.mark.parametrize("append", [False, True])
def test_a_sink_fed_nothing_for_its_stall_timeout_gives_up_and_closes_its_file(
    hasher_path, tmp_path, append
):
    """A stream that goes silent without ending (a dead link): the writer keeps what arrived
    and exits, instead of holding the file open for as long as sshd keeps the session. Every
    writer: python3's select timeout, and tee's watchdog where python3 is absent."""
    target = tmp_path / "x.partial"
    target.write_bytes(b"kept ")
    feeder = subprocess.Popen(["bash", "-c", "printf first; exec sleep 60"], stdout=subprocess.PIPE)
    started = time.monotonic()
    try:
        writer = subprocess.run(
            ["bash", "-c", sink(str(target), append=append, hashed=not append, stall_timeout=1)],
            stdin=feeder.stdout,
            capture_output=True,
            timeout=30,
            env={"PATH": hasher_path},
        )
    finally:
        feeder.kill()
        feeder.wait()
    assert writer.returncode == 3 and time.monotonic() - started < 20
    # One line, and only the writer's own: no shell notice of how tee was stopped.
    assert writer.stderr.decode() == f"dflash-relay: writing {target}: nothing for 1 s\n"
    assert target.read_bytes() == (b"kept first" if append else b"first")


def test_a_sink_with_a_stall_timeout_ends_with_its_stream(hasher_path, tmp_path):
    """The watchdog costs a transfer nothing: a stream that ends is written whole, hashed,
    and the writer exits at once (not at the watchdog's next look)."""
    target = tmp_path / "x.partial"
    started = time.monotonic()
    done = bash(
        sink(str(target), append=False, hashed=True, stall_timeout=30), hasher_path, PAYLOAD
    )
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert digest_in(done.stdout.decode()) == DIGEST and target.read_bytes() == PAYLOAD
    assert time.monotonic() - started < 5
    failed = bash(
        sink(str(tmp_path / "no" / "x"), append=True, hashed=False, stall_timeout=30),
        hasher_path,
        b"x",
    )
    assert failed.returncode != 0 and b"No such file or directory" in failed.stderr


def test_a_sink_that_cannot_write_fails(hasher_path, tmp_path):
    done = bash(
        sink(str(tmp_path / "missing" / "x"), append=False, hashed=True, stall_timeout=None),
        hasher_path,
        b"x",
    )
    assert done.returncode != 0  # (what it printed does not count: the status decides)


def test_no_hash_tool_is_named(tmp_path):
    directory = tmp_path / "bare"
    directory.mkdir()
    for name in BASICS:
        (directory / name).symlink_to(shutil.which(name))
    done = bash(hash_stdin(), str(directory), b"x")
    assert done.returncode == 127 and NO_HASHER in done.stderr.decode()


def test_move_relays_every_byte_and_both_digests_agree(source_file, tmp_path):
    target = tmp_path / "copy.partial"
    seen: list[int] = []

    def progress(state: RelayState) -> None:
        assert state.total == len(PAYLOAD)
        seen.append(state.done)

    read = f"cat -- {quoted(source_file)}"
    stat = f"stat -c '%s %Y %F' -- {quoted(source_file)}"
    source = ["bash", "-c", source_command(read, stat, hashed=True, path=str(source_file))]
    dest = ["bash", "-c", sink(str(target), append=False, hashed=True, stall_timeout=None)]
    moved = move(source, dest, len(PAYLOAD), progress)
    assert (moved.count, moved.source_rc, moved.dest_rc) == (len(PAYLOAD), 0, 0)
    assert moved.source_digest == moved.dest_digest == DIGEST
    assert moved.source_stat.size == len(PAYLOAD)
    assert target.read_bytes() == PAYLOAD
    assert seen == sorted(seen) and seen[-1] == len(PAYLOAD) and len(seen) >= 2


def test_a_destination_that_cannot_write_is_reported_with_its_reason(source_file, tmp_path):
    target = tmp_path / "no such dir" / "copy.partial"
    source = ["bash", "-c", stream_hashed("", str(source_file))]
    moved = move(
        source, ["bash", "-c", sink(str(target), append=False, hashed=True, stall_timeout=None)], 10
    )
    assert moved.dest_rc != 0 and moved.dest_digest is None
    assert stderr_reason(moved.dest_err) == (
        f"dflash-relay: writing {target}: No such file or directory"
    )


def test_digests_and_stats_are_read_from_the_last_marked_line():
    first, second = "a" * 64, "b" * 64
    moved = Moved(
        0,
        0,
        f"{SOURCE_MARK} {first}\nnoise\n{SOURCE_MARK} {second}\n"
        f"{STAT_MARK} 5 1700000000 regular file\n",
        0,
        f"{first}\n{second}  -\n",
        "",
    )
    assert moved.source_digest == second and moved.dest_digest == second
    assert (moved.source_stat.size, moved.source_stat.mtime) == (5, 1700000000)
    assert Moved(0, 0, f"{first}\n{STAT_MARK} garbage\n", 0, "", "").source_digest is None
    assert Moved(0, 0, f"{STAT_MARK} garbage\n", 0, "", "").source_stat is None
    assert Moved(0, 0, "", 0, "", "").source_stat is None
    assert digest_in(f"SHA2-256(stdin)= {first}") == first
    assert digest_in("A" * 64) is None and digest_in("a" * 63) is None


def test_the_readers_priorities_are_read_from_their_marked_lines():
    source_err = (
        f"{PRIORITY_MARK} trainer: nice 19, ionice idle\nnoise\n"
        f"{SOURCE_MARK} {'c' * 64}\n{PRIORITY_MARK} pct container 200: nice 19\n"
    )
    moved = Moved(0, 0, source_err, 0, "", "")
    assert moved.priorities == ["trainer: nice 19, ionice idle", "pct container 200: nice 19"]
    assert Moved(0, 0, "noise\n", 0, "", "").priorities == []


def test_stderr_reason_skips_the_stream_marks():
    text = f"warning\n  disk full  \n{SOURCE_MARK} {'c' * 64}\n{STAT_MARK} 1 2 regular file\n"
    assert stderr_reason(text) == "disk full"
