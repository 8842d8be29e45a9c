"""`make demo` beside a lab that is already up (another person's demo, a lab built by hand):
the demo builds only in a directory it made for the run, removes only its own lab when
interrupted, and never touches the other one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dflash_lab import lab as labs
from dflash_ops.remote.routes import network_namespaces
from tests.conftest import REPO

DEMO = [sys.executable, "-m", "dflash_lab.demo"]
SETTLE_S = 60  # for a demo that went wrong: how long it may act before it is stopped


def demo_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The demo's environment: its temp dir and results under `tmp_path`."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'remote'}:{REPO}",
        "TMPDIR": str(tmp_path / "tmp"),
        "DFLASH_DEMO_RESULTS": str(tmp_path / "results"),
        **extra,
    }


def start_demo(env: dict[str, str]) -> subprocess.Popen:
    """The demo in a process group of its own, as a terminal starts it (Ctrl-C reaches every
    process of the group)."""
    return subprocess.Popen(
        DEMO,
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,
    )


def ctrl_c(demo: subprocess.Popen) -> str:
    """Ctrl-C as a terminal sends it (to the group); the rest of the demo's output."""
    os.killpg(demo.pid, signal.SIGINT)
    rest, _ = demo.communicate(timeout=180)
    return rest


def is_up(lab: labs.Lab) -> bool:
    """Every sshd listener of the lab answers to its record, and every namespace exists."""
    return all(lab.sshd_running(name) for name in lab.state.hosts) and set(
        lab.state.namespaces
    ) <= set(network_namespaces())


def test_a_demo_pointed_at_a_running_lab_refuses_and_leaves_it_up(lab, tmp_path):
    demo = start_demo(demo_env(tmp_path, DFLASH_DEMO_DIR=str(lab.root)))
    deadline = time.monotonic() + SETTLE_S
    while demo.poll() is None and is_up(lab) and time.monotonic() < deadline:
        time.sleep(0.5)
    output = demo.communicate(timeout=180)[0] if demo.poll() is not None else ctrl_c(demo)
    assert demo.returncode == 1, output
    assert f"DFLASH_DEMO_DIR {lab.root} already exists" in output
    assert is_up(lab), output
    assert not (tmp_path / "results").exists()  # nothing of a demo was started


def test_an_interrupted_demo_removes_its_own_lab_and_no_other(lab, tmp_path):
    demo = start_demo(demo_env(tmp_path))
    seen = []
    assert demo.stdout is not None
    for line in demo.stdout:
        seen.append(line)
        if line.startswith("lab up at "):
            break
    said = next(line for line in seen if line.startswith("demo: this run's labs are built in"))
    root = Path(said.split(" built in ")[1].split(" (")[0])
    assert root.parent == tmp_path / "tmp" and root.name.startswith("dflash-demo-")
    assert root.stat().st_mode & 0o777 == 0o700
    own = labs.load(root / "lab")
    assert is_up(own) and is_up(lab)
    output = "".join(seen) + ctrl_c(demo)
    assert f"$ dflash-lab down --dir {root / 'lab'}" in output
    assert own.leftovers() == [], output
    assert not root.exists()
    assert is_up(lab), output
