"""Several hosts at once (`fab setup-eval-host`): dflash_ops.core.parallel runs a thread per
host, and one host's failure stops no other; dflash_ops.ui.host_lines shows one progress line
per host in a terminal, and every message as a line in a pipe."""

from __future__ import annotations

import io
import re
import signal
import threading
import time

import pytest
from rich.console import Console

from dflash_ops.core.errors import HostError, OpsError
from dflash_ops.core.parallel import SLICE_S, join_all, on_each_host, wait_for
from dflash_ops.ui.host_lines import HostLines


def test_hosts_work_at_the_same_time_and_results_keep_the_inventory_order():
    both = threading.Barrier(2, timeout=10)  # one after the other, the first would wait alone
    finished = []

    def work(name: str) -> str:
        both.wait()
        time.sleep(0.3 if name == "eval" else 0)
        return name.upper()

    results = on_each_host(["eval", "eval2"], work, lambda name, _: finished.append(name))
    assert results == ["EVAL", "EVAL2"] and finished == ["eval2", "eval"]


def test_one_hosts_error_is_its_own_after_the_others_finished():
    done = []

    def work(name: str) -> str:
        if name == "eval":
            raise OpsError("eval: /root/venv: the disk is full")
        time.sleep(0.2)
        return name

    with pytest.raises(OpsError, match=r"^eval: /root/venv: the disk is full$"):
        on_each_host(["eval", "eval2"], work, lambda name, _: done.append(name))
    assert done == ["eval2"]


def test_several_errors_are_one_naming_each_host():
    def work(name: str) -> str:
        if name != "eval3":
            raise HostError(name, "no SSH answer")
        return name

    with pytest.raises(HostError) as failed:
        on_each_host(["eval", "eval2", "eval3"], work)
    assert str(failed.value) == (
        "eval, eval2: failed on 2 of 3 hosts (the others finished): "
        "eval: no SSH answer; eval2: no SSH answer"
    )


def test_a_bug_keeps_its_own_exception():
    def work(name: str) -> str:
        raise KeyError(name)

    with pytest.raises(KeyError):
        on_each_host(["eval"], work)


def _ctrl_c_handed_to_a_worker(release: threading.Event) -> threading.Thread:
    """A thread that, once the main thread waits, receives the Ctrl-C itself (as the OS may
    hand a process-wide SIGINT to any thread), then holds on for seconds."""

    def worker() -> None:
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        release.wait(10)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("waiting", ["join_all", "wait_for"])
def test_a_ctrl_c_another_thread_received_ends_the_wait_at_once(waiting):
    release, started = threading.Event(), time.monotonic()
    thread = _ctrl_c_handed_to_a_worker(release)
    try:
        with pytest.raises(KeyboardInterrupt):
            join_all([thread]) if waiting == "join_all" else wait_for(threading.Event(), 30)
        # Unsliced, the wait ends only with the worker (10 s) or the timeout (30 s).
        assert time.monotonic() - started < 0.2 + 5 * SLICE_S
    finally:
        release.set()


def test_wait_for_says_whether_the_event_came():
    event = threading.Event()
    assert wait_for(event, 0.05) is False
    threading.Timer(0.05, event.set).start()
    assert wait_for(event, 10) is True


def test_in_a_pipe_every_message_is_a_line_as_it_comes():
    out = io.StringIO()
    console = Console(file=out, width=200)
    with HostLines(console).shown() as lines:
        lines.says("eval")("eval: provisioning /root/venv: no venv yet")
        lines.says("eval2")("eval2: installing torch")
    assert out.getvalue().splitlines() == [
        "eval: provisioning /root/venv: no venv yet",
        "eval2: installing torch",
    ]


def test_in_a_terminal_each_host_has_one_line_and_warnings_stay():
    out = io.StringIO()
    console = Console(file=out, width=40, force_terminal=True, color_system=None)
    with HostLines(console).shown() as lines:
        eval_says, eval2_says = lines.says("eval"), lines.says("eval2")
        threads = [
            threading.Thread(target=eval_says, args=("eval: installing " + "x" * 80,)),
            threading.Thread(target=eval2_says, args=("eval2: venv created",)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(0.4)  # a refresh (4 a second)
        eval_says("[yellow]warning:[/] eval: torch is a CUDA build")
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", out.getvalue())
    visible = [line for line in shown.split("\n") if line.strip()]
    assert "warning: eval: torch is a CUDA build" in visible
    assert "eval2: venv created" in visible
    progress = [line for line in visible if line.startswith("eval: installing")]
    assert progress and all(len(line) <= 40 and line.endswith("…") for line in progress)
