"""dflash_lab.models.cached_build: parallel test workers needing the same lab models build
them once (the others wait and reuse the result), and a failed build leaves nothing that
looks complete."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from dflash_lab.models import cached_build


def _slow_build(partial: Path, log: Path) -> None:
    with log.open("a") as lines:
        lines.write("built\n")
    time.sleep(1.0)  # long enough for the other process to arrive while this one builds
    (partial / "weights").write_text("w")


def _build_in(root: Path, log: Path) -> None:
    cached_build(root, lambda partial: _slow_build(partial, log), (1,), 0)


def test_two_processes_building_the_same_models_build_them_once(tmp_path):
    root, log = tmp_path / "models", tmp_path / "builds.log"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_build_in, args=(root, log)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert log.read_text() == "built\n"
    assert (root / "weights").read_text() == "w" and (root / "complete.json").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "builds.log",
        "models",
        "models.lock",
    ]  # no partial directory left behind


def test_a_failed_build_leaves_nothing_complete_and_the_next_one_builds(tmp_path):
    root = tmp_path / "models"

    def broken(partial: Path) -> None:
        (partial / "weights").write_text("half")
        raise RuntimeError("training diverged")

    with pytest.raises(RuntimeError, match="training diverged"):
        cached_build(root, broken, (1,), 0)
    assert not root.exists()
    cached_build(root, lambda partial: (partial / "weights").write_text("w"), (1,), 0)
    assert (root / "weights").read_text() == "w"
