"""The relay's hashing and verification on the workstation side (real bash, python3, openssl
and sha256sum; no SSH): every hash tool gives the same digest, the stream arrives whole and
its digests at both ends are read back correctly, and failures say which end failed."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from dflash_ops.core.errors import RemoteCommandError, TransferError
from dflash_ops.staging.relay import (
    SOURCE_MARK,
    LocalSide,
    Moved,
    RelayState,
    digest_in,
    move,
    stderr_reason,
)

HASHERS = ("python3", "openssl", "sha256sum")
# Over one splice chunk and one pipe buffer, not a multiple of either.
PAYLOAD = os.urandom((3 << 20) + 12345)
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


def side_with(hasher: str) -> LocalSide:
    side = LocalSide()
    assert side.set_hasher(f"{hasher}\n") == hasher
    return side


def run(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, check=False)


@pytest.fixture
def source_file(tmp_path) -> Path:
    path = tmp_path / "source dir" / "check'point.pt"  # a space and a quote: quoting matters
    path.parent.mkdir()
    path.write_bytes(PAYLOAD)
    return path


@pytest.mark.parametrize("hasher", HASHERS)
def test_hash_stdin_prints_the_sha256_with_every_tool(hasher, source_file):
    side = side_with(hasher)
    done = run(side.argv(side.hash_stdin()), PAYLOAD)
    assert done.returncode == 0
    assert digest_in(done.stdout.decode()) == DIGEST


@pytest.mark.parametrize("hasher", HASHERS)
def test_stream_hashed_sends_the_bytes_and_their_digest_on_the_side(hasher, source_file):
    side = side_with(hasher)
    done = run(side.argv(side.stream_hashed(f"cat -- {_quoted(source_file)}")))
    assert done.returncode == 0, done.stderr
    assert done.stdout == PAYLOAD
    moved = Moved(len(PAYLOAD), 0, done.stderr.decode(), 0, "", "")
    assert moved.source_digest == DIGEST


def test_stream_hashed_reads_a_plain_file_itself(source_file):
    side = side_with("python3")
    command = side.stream_hashed("false", str(source_file))  # the read command is not used
    done = run(side.argv(command))
    assert done.returncode == 0 and done.stdout == PAYLOAD
    assert f"{SOURCE_MARK} {DIGEST}" in done.stderr.decode()


@pytest.mark.parametrize("hasher", HASHERS)
def test_a_failing_read_fails_the_stream(hasher, tmp_path):
    side = side_with(hasher)
    done = run(side.argv(side.stream_hashed(f"cat -- {tmp_path}/missing")))
    assert done.returncode != 0 and done.stdout == b""


@pytest.mark.parametrize("hasher", HASHERS)
def test_sink_writes_hashes_and_appends(hasher, tmp_path):
    side = side_with(hasher)
    target = tmp_path / "dest dir" / "it's.partial"
    target.parent.mkdir()
    done = run(side.argv(side.sink(str(target), append=False, hashed=True)), PAYLOAD[:1000])
    assert done.returncode == 0, done.stderr
    assert digest_in(done.stdout.decode()) == hashlib.sha256(PAYLOAD[:1000]).hexdigest()
    done = run(side.argv(side.sink(str(target), append=True, hashed=False)), PAYLOAD[1000:])
    assert done.returncode == 0 and digest_in(done.stdout.decode()) is None
    assert "unhashed" in done.stdout.decode()
    assert target.read_bytes() == PAYLOAD
    run(side.argv(side.sink(str(target), append=False, hashed=True)), b"short")
    assert target.read_bytes() == b"short"  # a fresh sink truncates


@pytest.mark.parametrize("hasher", HASHERS)
def test_move_relays_every_byte_and_both_digests_agree(hasher, source_file, tmp_path):
    side = side_with(hasher)
    target = tmp_path / "copy.partial"
    seen: list[int] = []

    def progress(state: RelayState) -> None:
        assert state.total == len(PAYLOAD)
        seen.append(state.done)

    source = side.argv(side.stream_hashed(f"cat -- {_quoted(source_file)}"))
    sink = side.argv(side.sink(str(target), append=False, hashed=True))
    moved = move(source, sink, len(PAYLOAD), progress)
    assert (moved.count, moved.source_rc, moved.dest_rc) == (len(PAYLOAD), 0, 0)
    assert moved.source_digest == moved.dest_digest == DIGEST
    assert target.read_bytes() == PAYLOAD
    assert seen == sorted(seen) and seen[-1] == len(PAYLOAD) and len(seen) >= 2


def test_a_destination_that_cannot_write_is_reported_with_its_reason(source_file, tmp_path):
    side = side_with("python3")
    target = tmp_path / "no such dir" / "copy.partial"
    source = side.argv(side.stream_hashed("", str(source_file)))
    moved = move(source, side.argv(side.sink(str(target), append=False, hashed=True)), 10)
    assert moved.dest_rc != 0 and moved.dest_digest is None
    assert stderr_reason(moved.dest_err) == (
        f"dflash-relay: writing {target}: No such file or directory"
    )


def test_a_source_that_fails_is_reported_with_nothing_moved(tmp_path):
    side = side_with("python3")
    source = side.argv(side.stream_hashed(f"cat -- {tmp_path}/missing"))
    sink = side.argv(side.sink(str(tmp_path / "copy"), append=False, hashed=True))
    moved = move(source, sink, 10)
    assert moved.count == 0 and moved.source_rc != 0  # (its digest is of no bytes)
    assert "No such file or directory" in stderr_reason(moved.source_err)


def test_digests_are_read_from_the_last_line_that_carries_one():
    first, second = "a" * 64, "b" * 64
    moved = Moved(
        0,
        0,
        f"{SOURCE_MARK} {first}\nnoise\n{SOURCE_MARK} {second}\n",
        0,
        f"{first}\n{second}  -\n",
        "",
    )
    assert moved.source_digest == second and moved.dest_digest == second
    assert Moved(0, 0, f"{first}\n", 0, "unhashed\n", "").source_digest is None
    assert digest_in(f"SHA2-256(stdin)= {first}") == first
    assert digest_in("A" * 64) is None and digest_in("a" * 63) is None


def test_stderr_reason_is_the_last_line_that_is_not_a_digest():
    assert stderr_reason(f"warning\n  disk full  \n{SOURCE_MARK} {'c' * 64}\n") == "disk full"
    assert stderr_reason(f"{SOURCE_MARK} {'c' * 64}\n") == "no error output"
    assert stderr_reason("   \n") == "no error output"


def test_the_hash_tool_is_found_and_its_absence_explained():
    side = LocalSide()
    assert side.hasher == "python3"  # the workstation has python3 (this very test runs on it)
    with pytest.raises(TransferError, match="none of python3, openssl, sha256sum found"):
        LocalSide().set_hasher("\n")


def test_local_commands_report_failures_with_their_exit_code(tmp_path):
    side = LocalSide()
    assert side.run("echo out; echo err >&2").stdout == "out\n"
    result = side.run("echo nope >&2; exit 3", check=False)
    assert (result.exit_code, result.ok, result.stderr) == (3, False, "nope\n")
    with pytest.raises(RemoteCommandError) as raised:
        side.run("echo nope >&2; exit 3")
    assert raised.value.exit_code == 3 and "nope" in str(raised.value)


def test_free_bytes_is_what_the_filesystem_reports(tmp_path):
    stats = os.statvfs(tmp_path)
    free = LocalSide().free_bytes(str(tmp_path))
    assert abs(free - stats.f_bavail * stats.f_frsize) < 256 << 20  # others write there too


def test_a_held_command_reads_lines_until_closed(tmp_path):
    held = LocalSide().hold("echo ready; cat > /dev/null; echo gone >&2")
    assert held.readline() == "ready\n"
    held.close()
    assert held.errors() == "gone\n"


def _quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"
