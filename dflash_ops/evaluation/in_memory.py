"""Run the workstation's harness on an eval host without writing it there.

A dry run must leave the host as it found it, so the harness is not deployed for it: its
source files travel compressed on the first line of the command's stdin, a short loader
(`python -B -c`, so not even bytecode is written) imports them from memory and calls the
harness's command line with the given argv; the rest of stdin is the harness's own stdin.
The code that answers is exactly the code a real run would deploy.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import zlib

from dflash_eval.contract.version import harness_files

from dflash_ops.core.errors import HostError
from dflash_ops.provision.harness import HARNESS_PACKAGE, HARNESS_SOURCE
from dflash_ops.remote.connection import Host, Result
from dflash_ops.remote.messages import stderr_reason

# Imports `dflash_eval.*` from the {relative path: source} map on stdin's first line.
LOADER = """
import base64, importlib.abc, importlib.util, json, sys, zlib
files = json.loads(zlib.decompress(base64.b64decode(sys.stdin.readline())))
class FromMemory(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        base = name.replace(".", "/")
        for relative, package in ((base + "/__init__.py", True), (base + ".py", False)):
            if relative in files:
                return importlib.util.spec_from_loader(
                    name, self, origin="<memory>/" + relative, is_package=package)
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.__file__ = module.__spec__.origin
        relative = module.__file__[len("<memory>/"):]
        exec(compile(files[relative], module.__file__, "exec"), module.__dict__)
sys.meta_path.insert(0, FromMemory())
from dflash_eval.cli import entry
sys.exit(entry(sys.argv[1:]))
"""
TIMEOUT_S = 600  # reading a real target's tokenizer and headers takes seconds, not minutes
SSH_FAILED = 255  # ssh's own exit status (the harness exits 0, 1, 2 or 130)
# Nothing from the network, nothing cached: the libraries read only local files.
ENVIRONMENT = "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1"


def harness_payload() -> str:
    """The harness's sources as one line: base64 of zlib-compressed JSON."""
    files = {
        f"{HARNESS_PACKAGE}/{relative}": (HARNESS_SOURCE / relative).read_text(encoding="utf-8")
        for relative in harness_files(HARNESS_SOURCE)
    }
    packed = zlib.compress(json.dumps(files).encode(), 9)
    return base64.b64encode(packed).decode()


def run_harness(host: Host, python: str, argv: list[str], stdin: str = "") -> Result:
    """`python -m dflash_eval ARGV` on the host from memory; its result, unchecked.

    Through an OpenSSH process, not Fabric: Fabric feeds a string to stdin one byte per
    poll (10 ms each), minutes for the ~100 KB of sources."""
    command = f"env {ENVIRONMENT} {shlex.quote(python)} -B -c {shlex.quote(LOADER)}"
    try:
        done = subprocess.run(
            host.ssh_argv(f"{command} {shlex.join(argv)}"),
            input=harness_payload() + "\n" + stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise HostError(
            host.name, f"the harness gave no answer within {TIMEOUT_S} s; is the host overloaded?"
        ) from None
    if done.returncode == SSH_FAILED:
        raise HostError(host.name, f"ssh failed: {stderr_reason(done.stderr)}")
    return Result(done.stdout, done.stderr, done.returncode)


def harness_event(host: str, answer: Result, event: str, failure: str) -> dict:
    """The harness's `event` line (JSON on stdout) of a command that succeeded; otherwise a
    HostError: `failure` then the harness's own `error:` line (the last of its stderr when
    it wrote none)."""
    for line in answer.stdout.splitlines() if answer.ok else []:
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("event") == event:
            return found
    errors = [line for line in answer.stderr.splitlines() if line.startswith("error: ")]
    reason = errors[-1].removeprefix("error: ") if errors else answer.stderr.strip()[-1500:]
    raise HostError(host, f"{failure} (exit {answer.exit_code}): {reason}")
