"""What `--out` (and every other local write) may replace: a regular file, never a device,
a FIFO, a directory or a symbolic link; a missing directory is named, not made; a full disk
is one line, with no partial file left and the previous file as it was. A read command
(`compare`, in any format) writes nothing unless asked."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from dflash_ops.core.errors import OpsError
from dflash_ops.core.files import write_atomic
from tests.conftest import run_fab
from tests.unit.test_inert_text import _inventory
from tests.unit.test_report import pull

WRITERS = {  # each task that writes a file the user names, and the name it gives it
    "report": ("report", "--out", "report.html"),
    "export": ("export", "--out", "tidy.csv"),
}


@pytest.fixture(scope="module")
def pulled(tmp_path_factory) -> tuple[Path, Path]:
    """Two pulled runs, and an inventory whose results they are."""
    root = tmp_path_factory.mktemp("pulled") / "results"
    pull(root, 2000, 2.0)
    pull(root, 4000, 3.0)
    return root, _inventory(root.parent, root)


def _special(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":  # the null device's numbers, made here: /dev itself is never touched
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.mark.parametrize(
    ("kind", "task"), [("device", "report"), ("fifo", "export"), ("directory", "report")]
)
def test_out_refuses_what_is_no_regular_file_and_leaves_it(pulled, tmp_path, task, kind):
    _, inventory = pulled
    name, flag, file_name = WRITERS[task]
    target = tmp_path / file_name
    _special(kind, target)
    before = os.lstat(target)
    refused = run_fab(inventory, name, flag, str(target))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    message = refused.stderr.strip()
    assert "\n" not in message and f"{target}: is a" in message and "not a regular file" in message
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert [p.name for p in tmp_path.iterdir()] == [file_name]  # no partial file beside it


@pytest.mark.parametrize("task", sorted(WRITERS))
def test_out_refuses_a_symbolic_link_and_says_so(pulled, tmp_path, task):
    _, inventory = pulled
    name, flag, file_name = WRITERS[task]
    kept = tmp_path / "kept.txt"
    kept.write_text("the user's own file\n")
    link = tmp_path / file_name
    link.symlink_to(kept)
    refused = run_fab(inventory, name, flag, str(link))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"{link}: is a symbolic link (to {kept})" in refused.stderr
    assert link.is_symlink() and kept.read_text() == "the user's own file\n"


def test_out_in_a_missing_directory_names_it_and_makes_nothing(pulled, tmp_path):
    _, inventory = pulled
    missing = tmp_path / "no" / "such"
    refused = run_fab(inventory, "export", "--out", str(missing / "tidy.csv"))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"its directory {missing} does not exist" in refused.stderr
    assert not (tmp_path / "no").exists()


@pytest.fixture
def tiny_disk(tmp_path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own (root only: it is a real disk that fills)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "dflash-test-disk", str(disk)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill(directory: Path) -> None:
    """Take every free byte of `directory`'s filesystem."""
    handle = os.open(directory / ".filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for block in (b"\0" * 65536, b"\0" * 512, b"\0"):
            with suppress(OSError):
                while True:
                    os.write(handle, block)
        with pytest.raises(OSError) as full:
            os.write(handle, b"\0")
        assert full.value.errno == errno.ENOSPC
    finally:
        os.close(handle)


@pytest.mark.parametrize("command", [("report",), ("export",), ("compare", "--report")])
def test_a_full_disk_is_one_line_no_partial_file_and_the_old_file_kept(tiny_disk, command):
    task = command[0]
    root = tiny_disk / "results"
    pull(root, 2000, 2.0)
    inventory = _inventory(tiny_disk.parent, root)
    target = root / ("export.csv" if task == "export" else "report.html")
    target.write_text("the previous file\n")
    _fill(tiny_disk)
    failed = run_fab(inventory, *command)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    message = failed.stderr.strip()
    assert "\n" not in message and message.startswith(
        f"error: {target}: the disk is full (0 B free"
    )
    assert target.read_text() == "the previous file\n"
    assert not [path for path in root.rglob("*") if "partial" in path.name]


def test_any_failed_write_is_an_ops_error_naming_the_path(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old\n")
    (tmp_path / f".out.csv.{os.getpid()}.partial").mkdir()  # where the partial file would go
    with pytest.raises(OpsError, match=rf"^{target}: could not write it \(Is a directory\)"):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"


# --- compare reads only: it writes nothing unless asked (--plots [DIR], --report) ----------


def _files(root: Path) -> dict[str, float]:
    return {str(path): path.stat().st_mtime_ns for path in sorted(root.rglob("*"))}


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "markdown"])
def test_compare_in_any_format_writes_nothing(pulled, fmt):
    root, inventory = pulled
    before = _files(root)
    shown = run_fab(inventory, "compare", "--format", fmt)
    assert shown.returncode == 0, shown.stderr
    assert _files(root) == before
    assert "\nreport: " not in shown.stdout + shown.stderr
    assert "\nplot: " not in shown.stdout + shown.stderr


def test_the_table_says_how_to_get_the_plots_and_the_report(pulled):
    shown = run_fab(pulled[1], "compare")
    assert "plots and the HTML report: add --plots and --report" in shown.stdout


def test_plots_and_report_are_written_when_asked(pulled, tmp_path):
    root, inventory = pulled
    asked = run_fab(inventory, "compare", "--format", "json", "--plots", "--report")
    assert asked.returncode == 0, asked.stderr
    assert (root / "plots" / "tau_vs_step.png").stat().st_size > 1000
    assert f"report: {root / 'report.html'}" in asked.stderr
    assert (root / "report.html").stat().st_size > 1000
    elsewhere = run_fab(inventory, "compare", "--plots", str(tmp_path))
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert (tmp_path / "tau_vs_step.png").exists()
