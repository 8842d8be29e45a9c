"""An SGLang server of the tool's own on an eval host (`fab served-eval`): the GPU and port
probes that decide whether one may start, its launch, its health wait and its stop.

The server is started with `setsid`, so it leads a process group of its own (SGLang starts
scheduler and detokenizer processes beside it), and recorded as a pid + start-time claim
(process_claims.py) in its directory. It is signalled, with its group, only while that claim
is `live`: a pid that now names another process is never touched. The server that the
inventory's `sglang_url` names is never started, probed or stopped here: its port is skipped.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from dflash_ops.core.errors import HostError
from dflash_ops.core.sglang_launch import SglangLaunch
from dflash_ops.remote import process_claims
from dflash_ops.remote.connection import Host
from dflash_ops.remote.probes import Probe, ProbeParseError

PID_FILE = "server.pid"
LOG_FILE = "server.log"
STOP_WAIT_S = 30  # seconds between SIGTERM to the server's group and SIGKILL
NO_SMI = "@@no-nvidia-smi"


def _smi_path(python: str) -> str:
    """PATH with the SGLang environment's bin first (where a container may keep nvidia-smi)."""
    return f"PATH={shlex.quote(python.rpartition('/')[0])}:$PATH"


def gpu_users(python: str) -> Probe[dict[int, list[str]]]:
    """Per GPU index, the pids of the compute processes nvidia-smi lists on it."""
    smi = f"{_smi_path(python)} nvidia-smi"
    command = (
        f"if ! {_smi_path(python)} command -v nvidia-smi >/dev/null; then echo {NO_SMI}; else "
        f"{smi} --query-gpu=index,uuid --format=csv,noheader && echo @@apps && "
        f"{smi} --query-compute-apps=gpu_uuid,pid --format=csv,noheader; fi"
    )
    return Probe(command, parse_gpu_users)


def parse_gpu_users(output: str) -> dict[int, list[str]]:
    if output.strip() == NO_SMI:
        raise ProbeParseError("nvidia-smi is not on the host's PATH")
    gpus_part, marker, apps_part = output.partition("@@apps")
    if not marker:
        raise ProbeParseError(f"unexpected nvidia-smi output: {output[:200]!r}")
    by_uuid: dict[str, int] = {}
    for line in filter(None, map(str.strip, gpus_part.splitlines())):
        index, _, uuid = (part.strip() for part in line.partition(","))
        if not index.isdigit():
            raise ProbeParseError(f"unexpected nvidia-smi GPU line: {line!r}")
        by_uuid[uuid] = int(index)
    users: dict[int, list[str]] = {index: [] for index in by_uuid.values()}
    for line in filter(None, map(str.strip, apps_part.splitlines())):
        uuid, _, pid = (part.strip() for part in line.partition(","))
        if uuid in by_uuid:
            users[by_uuid[uuid]].append(pid)
    return users


def require_free_gpus(host: Host, launch: SglangLaunch) -> None:
    """One line when a GPU the server would use is missing or busy (a process on it)."""
    try:
        users = host.probe(gpu_users(launch.python))
    except ProbeParseError as error:
        raise HostError(
            host.name, f"cannot tell whether GPUs {launch.gpus} are free: {error}"
        ) from None
    missing = [gpu for gpu in launch.gpus if gpu not in users]
    busy = {gpu: users[gpu] for gpu in launch.gpus if users.get(gpu)}
    if missing:
        raise HostError(host.name, f"GPU {missing[0]} of sglang.gpus is not there (nvidia-smi)")
    if busy:
        gpu, pids = next(iter(busy.items()))
        raise HostError(
            host.name,
            f"GPU {gpu} is busy (processes {', '.join(pids)}); served-eval starts no server "
            "beside them: free it, or name other GPUs in sglang.gpus",
        )


def free_port(host: Host, python: str, ports: Sequence[int], sglang_url: str | None) -> int:
    """The first port of `ports` nothing listens on (127.0.0.1), skipping sglang_url's."""
    theirs = urlsplit(sglang_url).port if sglang_url else None
    wanted = [port for port in ports if port != theirs]
    script = (
        "import socket,sys\n"
        "for p in map(int, sys.argv[1:]):\n"
        "    s = socket.socket()\n"
        "    try:\n"
        "        s.bind(('127.0.0.1', p))\n"
        "    except OSError:\n"
        "        continue\n"
        "    finally:\n"
        "        s.close()\n"
        "    print(p)\n"
        "    break\n"
    )
    argv = [python, "-c", script, *map(str, wanted)]
    answer = host.run(shlex.join(argv), check=False).stdout.strip()
    if not answer.isdigit():
        shown = f"{ports[0]}-{ports[-1]}" if len(ports) > 1 else str(ports[0])
        raise HostError(host.name, f"port {shown} (sglang.ports) is taken: nothing to start on")
    return int(answer)


@dataclass(frozen=True)
class Server:
    directory: str  # holds the pid claim and the log
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start(host: Host, launch: SglangLaunch, directory: str, argv: Sequence[str]) -> None:
    """`python -m sglang.launch_server ARGV` detached in its own session, its claim recorded."""
    gpus = ",".join(map(str, launch.gpus))
    command = [launch.python, "-m", "sglang.launch_server", *argv]
    host.run(
        f"{process_claims.SHELL}\nmkdir -p {shlex.quote(directory)} && cd {shlex.quote(directory)}"
        f" && {{ CUDA_VISIBLE_DEVICES={shlex.quote(gpus)} setsid {shlex.join(command)} "
        f"> {LOG_FILE} 2>&1 < /dev/null & dflash_record $! {PID_FILE}; }}"
    )


def wait_healthy(host: Host, python: str, server: Server, timeout_s: int) -> None:
    """Until GET /health answers 200; the server's death or the timeout fails with its log."""
    pid = f"$(cat {shlex.quote(server.directory)}/{PID_FILE})"
    script = (
        "import os,sys,time,urllib.request\n"
        "url, pid, end = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])\n"
        "while time.monotonic() < end:\n"
        "    try:\n"
        "        urllib.request.urlopen(url, timeout=5).read(); sys.exit(0)\n"
        "    except OSError:\n"
        "        pass\n"
        "    if not os.path.exists('/proc/' + pid): sys.exit(3)\n"
        "    time.sleep(0.5)\n"
        "sys.exit(4)\n"
    )
    argv = shlex.join([python, "-c", script, f"{server.url}/health"])
    result = host.run(f"{argv} {pid} {timeout_s}", check=False)
    if result.exit_code == 0:
        return
    why = "ended" if result.exit_code == 3 else f"did not answer /health within {timeout_s} s"
    log = host.run(f"tail -n 20 -- {shlex.quote(server.directory)}/{LOG_FILE}", check=False)
    raise HostError(
        host.name,
        f"the SGLang server on port {server.port} {why}; its log ends:\n{log.stdout.rstrip()}",
    )


def stop(host: Host, directory: str) -> str:
    """Stop the server recorded in `directory` and its process group, if the claim is still
    `live`; returns the verdict (live: it was stopped)."""
    quoted = shlex.quote(directory)
    result = host.run(
        f"{process_claims.SHELL}\ncd {quoted} || exit 0\ndflash_claim {PID_FILE}\n"
        f'if [ "$dflash_verdict" = live ]; then kill -TERM -- "-$dflash_pid" 2>/dev/null\n'
        f'  i=0; while kill -0 -- "-$dflash_pid" 2>/dev/null && [ $i -lt {STOP_WAIT_S * 5} ];'
        "  do sleep 0.2; i=$((i+1)); done\n"
        '  kill -KILL -- "-$dflash_pid" 2>/dev/null\nfi\n'
        f"echo {process_claims.SAID}",
        check=False,
    )
    return result.stdout.strip().partition(" ")[0] or "none"
