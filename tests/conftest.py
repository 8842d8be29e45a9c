"""Fixtures shared by the whole suite: real labs (sshd hosts in network namespaces as root,
loopback sshd otherwise), a runner for the real `fab` command against a lab inventory, and a
webhook endpoint on loopback (`hook`, `HookServer`) for the watch's webhook.

Tests talk only to lab hosts: every lab inventory carries its state file, and the library
checks the lab's routes before the first connection (see dflash_ops.remote.routes).
"""

from __future__ import annotations

import gc
import io
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dflash_lab import inventory as lab_inventory
from dflash_lab import lab as labs
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.staging import catalog

REPO = Path(__file__).resolve().parent.parent
FAB = Path(sys.executable).parent / "fab"


def pytest_configure(config: pytest.Config) -> None:
    """Tests send SIGINT (a Ctrl-C) to the processes they start. A shell without job control
    starts background commands with SIGINT ignored, children inherit that, and a Python whose
    SIGINT is ignored at start never raises KeyboardInterrupt: so put the default back, and
    the children start with it (a handler, unlike an ignore, is reset by exec)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if getattr(config.option, "numprocesses", None):
        # Parallel workers run several labs at once on the same cores: one torch thread per
        # harness run (workers inherit the variable).
        os.environ.setdefault(lab_inventory.THREADS_VARIABLE, "1")
    # A worker holds ~2·10^5 long-lived objects (torch, transformers, the collected items):
    # at the default young threshold (700) the collector keeps scanning them. Measured on the
    # unit tier: 70.5 and 75.9 s with this and the freeze below, 79.3 and 80.5 s without.
    gc.set_threshold(50_000, 20, 10)


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.freeze()  # what collection made lives until the end: no collection needs to scan it


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle",
        type=int,
        metavar="SEED",
        help="run the tests in a shuffled order (modules, and tests within each module; a "
        "module's tests stay together so its lab is built once): order dependence shows",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("--shuffle")
    return None if seed is None else f"shuffled with seed {seed} (--shuffle {seed} repeats it)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules marked `long(seconds)` first, longest first (parallel workers take modules in
    this order, so the longest start at once instead of ending the run alone), or every
    module shuffled."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = list(modules.values())
    seed = config.getoption("--shuffle")
    if seed is None:
        order.sort(key=lambda module: -_expected_seconds(module[0]))
        items[:] = [item for module_items in order for item in module_items]
        return
    shuffler = random.Random(seed)
    shuffler.shuffle(order)
    for module_items in order:
        shuffler.shuffle(module_items)
    items[:] = [item for module_items in order for item in module_items]


# Modules that share a session lab (a session fixture is built once per xdist worker) run on
# one worker, or each worker they land on builds the lab again: module → the module it joins.
SAME_WORKER = {"tests/e2e/test_run_eval_features.py": "tests/e2e/test_extract_features.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the modules of SAME_WORKER joined to theirs."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return Scheduling(config, log)


def work_unit(nodeid: str) -> str:
    """What a test is sent to a worker with: its module, or the module SAME_WORKER joins it to."""
    module = nodeid.split("::", 1)[0]
    return SAME_WORKER.get(module, module)


def _expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("long")
    return marker.args[0] if marker else 0.0


@pytest.fixture(autouse=True)
def _never_the_example_inventory(monkeypatch):
    """The committed inventory.yaml names a user's real servers: no test may fall back to it."""
    monkeypatch.setenv("DFLASH_INVENTORY", "/nonexistent/tests-must-pass-a-lab-inventory.yaml")


@pytest.fixture(autouse=True)
def _no_stability_wait(monkeypatch):
    """A listing looks twice at a checkpoint written in the last seconds, a window apart:
    the lab writes its checkpoints just before the tests list them, so no test waits that
    window (the growing-file test puts a real one back)."""
    monkeypatch.setattr(catalog, "STABILITY", catalog.Stability(window_s=0.0))


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[labs.Lab]:
    """One lab for the session's read-only tests (random-byte checkpoints). A test that
    changes it must put it back as it was, or use `make_lab` instead."""
    built = labs.up(labs.LabConfig(root=tmp_path_factory.mktemp("lab") / "lab"))
    yield built
    problems = built.down()
    assert not problems, problems


@pytest.fixture
def make_lab(tmp_path_factory) -> Iterator[Callable[..., labs.Lab]]:
    """Build a fresh lab for one test (`make_lab(eval_hosts=2, trainer_disk='64m', …)`);
    removed after the test, even when it fails."""
    built: list[labs.Lab] = []

    def make(content: labs.ContentGenerator | None = None, **config) -> labs.Lab:
        root = tmp_path_factory.mktemp("lab") / "lab"
        built.append(labs.up(labs.LabConfig(root=root, **config), content))
        return built[-1]

    yield make
    for each in built:
        problems = each.down()
        assert not problems, problems


def provisioned_models_lab(
    tmp_path_factory: pytest.TempPathFactory,
    content: labs.ContentGenerator = labs.trained_models,
    **config: Any,
) -> Iterator[labs.Lab]:
    """A lab with a tiny target, trained drafter checkpoints (`content`: the lab's tiny Qwen3
    by default) and its eval hosts set up (`LabConfig` fields in `config`), for a module
    fixture to `yield from`: it is removed, and checked, when the module is done."""
    # Imported here: the provisioning stack costs every other test session half a second.
    from dflash_ops.provision.setup import setup_eval_hosts

    built = labs.up(labs.LabConfig(root=tmp_path_factory.mktemp("lab") / "lab", **config), content)
    try:
        setup_eval_hosts(load_inventory(built.inventory_path), None, False, say=lambda _: None)
        yield built
    finally:
        assert not built.down()


@pytest.fixture
def inventory(lab) -> Inventory:
    return load_inventory(lab.inventory_path)


def run_fab(
    inventory_path: Path | None, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run `fab` against an inventory as the command line would (from the repo root), in this
    process, and return its exit status and output as a finished `fab` process would. A test
    that checks what fab prints and its status gets the same, without a Python starting and
    importing Fabric for each call; tests of signals and detaching start the real process
    (`start_fab`)."""
    from fabric.main import make_program

    return run_in_process(
        lambda argv: make_program().run(argv), inventory_path, "fab", *args, timeout=timeout
    )


def run_lab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`dflash-lab` (the lab's own program: up, down, status) as `run_fab` runs fab."""
    from dflash_lab.tasks import main

    return run_in_process(main, None, "dflash-lab", *args, timeout=timeout)


def run_in_process(
    main: Callable[[list[str]], None],
    inventory_path: Path | None,
    *argv: str,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """`main(argv)` run as its command would be (from the repo root, against the inventory),
    in this process: its exit status and output."""
    args = argv[1:]
    out, err = io.StringIO(), io.StringIO()
    saved, cwd = os.environ.get("DFLASH_INVENTORY"), os.getcwd()
    if inventory_path is not None:
        os.environ["DFLASH_INVENTORY"] = str(inventory_path)
    os.chdir(REPO)
    try:
        with redirect_stdout(out), redirect_stderr(err), _deadline(timeout, args):
            code = _exit_status(lambda: main(list(argv)))
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("DFLASH_INVENTORY", None)
        else:
            os.environ["DFLASH_INVENTORY"] = saved
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())


def _exit_status(main: Callable[[], None]) -> int:
    """What the process would exit with: sys.exit's status (a message is printed and is 1);
    an uncaught exception (a bug) is printed with its traceback, status 1."""
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired:
        raise
    except Exception:
        traceback.print_exc()
        return 1
    return 0


@contextmanager
def _deadline(seconds: float, args: tuple[str, ...]) -> Iterator[None]:
    """Raise TimeoutExpired in the task (as subprocess.run's timeout would) once `seconds`
    have passed."""

    def expire(signum, frame):
        raise subprocess.TimeoutExpired(["fab", *args], seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def start_fab(inventory_path: Path | None, *args: str) -> subprocess.Popen:
    """The real `fab` process, started and not waited for (signals, detached runs); output
    piped. The checkout's own packages come first on its path, whatever the venv was
    installed from. It leads a process group of its own, as a shell's command does: a test
    sends a terminal's Ctrl-C to it and its children with os.killpg, never to pytest."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'remote'}:{REPO}"}
    if inventory_path is not None:
        env["DFLASH_INVENTORY"] = str(inventory_path)
    return subprocess.Popen(
        [str(FAB), *args],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
    )


@pytest.fixture
def fab() -> Callable[..., subprocess.CompletedProcess]:
    return run_fab


# --- a webhook endpoint on loopback ---------------------------------------------------------


class HookServer:
    """Records each POSTed JSON body; answers with the queued statuses, then 200."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.posts: queue.Queue[dict] = queue.Queue()
        self.statuses = list(statuses or [])
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.posts.put(json.loads(body))
                self.send_response(server.statuses.pop(0) if server.statuses else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.http.server_port}{path}"

    def received(self) -> list[dict]:
        found = []
        while not self.posts.empty():
            found.append(self.posts.get_nowait())
        return found

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def hook() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()
