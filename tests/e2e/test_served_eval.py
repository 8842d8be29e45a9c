"""`fab export-drafter` and `fab served-eval` end to end on the shared e2e lab: the SGLang
stand-in (tests/sglang_stand_in.py, DFLASH mode) launched on the eval host as
`python -m sglang.launch_server` through an `sglang.python` wrapper, beside an nvidia-smi
stand-in that lists two GPUs and, when the test says so, a process on one. What this cannot
show (the real SGLang launch, GPU numerics) is docs/served.md's "What the lab leaves unproven".
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from dflash_ops.core.inventory import load
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import REPO, run_fab, start_fab

pytestmark = pytest.mark.long(85)  # seconds in a cold `make test` (5 workers)

QUICK = ["--num-prompts", "2", "--max-new-tokens", "24"]
GPUS = "0, GPU-aaaa\n1, GPU-bbbb\n"


def servers_alive(inventory: Path) -> list[int]:
    """Live (not zombie) processes of sglang.launch_server serving a drafter staged on the
    lab's eval host (the lab's namespaces share this machine's process table)."""
    staging = EvalLayout(load(inventory).eval_hosts["eval"]).staging.encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if b"sglang.launch_server" in cmdline and staging in cmdline:
                state = (proc / "stat").read_text().rpartition(") ")[2].split()[0]
                if state != "Z":
                    found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


@pytest.fixture
def served_lab(e2e_lab, tmp_path):
    """The shared lab's inventory with eval's `sglang` section (GPU 1, ten ports), the
    stand-in's wrapper and nvidia-smi in tmp_path/bin; yields (inventory, bin, log). The
    exported drafters and served directories are removed afterwards."""
    inventory = load(e2e_lab.inventory_path)
    entry = inventory.eval_hosts["eval"]
    layout = EvalLayout(entry)
    bin_dir, log = tmp_path / "bin", tmp_path / "server.jsonl"
    bin_dir.mkdir()
    path = ":".join(str(p) for p in (REPO / "tests" / "stand_ins", REPO / "remote", REPO))
    (bin_dir / "python").write_text(
        f"#!/bin/sh\nexport PYTHONPATH={shlex.quote(path)} "
        f'SGLANG_STAND_IN_LOG={shlex.quote(str(log))}\nexec {shlex.quote(layout.python)} "$@"\n'
    )
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\ncase "$*" in\n'
        f"  *query-gpu*) printf %s {shlex.quote(GPUS)};;\n"
        f"  *query-compute-apps*) cat {shlex.quote(str(bin_dir / 'apps'))} 2>/dev/null || :;;\n"
        "esac\n"
    )
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1] % 50000 + 10000
    document = yaml.safe_load(e2e_lab.inventory_path.read_text())
    sglang = {"python": str(bin_dir / "python"), "gpus": [1], "ports": f"{first}-{first + 9}"}
    document["hosts"]["eval"]["sglang"] = sglang
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    yield path, bin_dir, log
    host = Host(inventory, "eval")
    for step in (2000, 4000):
        exported = EvalLayout.exported(layout.staged_checkpoint(step))
        host.run(f"rm -rf -- {shlex.quote(exported)} {shlex.quote(layout.workdir)}/served")
    host.close()


def test_export_then_served_tau_equals_the_cpu_tau_in_sglangs_count(served_lab):
    inventory, _, log = served_lab
    local = inventory.parent / "drafter"
    (local).mkdir()
    (local / "notes.txt").write_text("mine")  # not the tool's: refused, left as it is
    step = ["--step", "4000", "--host", "eval", "--local", str(local)]
    refused = run_fab(inventory, "export-drafter", *step)
    assert refused.returncode == 1 and "was not written by export-drafter" in refused.stderr
    assert sorted(p.name for p in local.iterdir()) == ["notes.txt"]
    (local / "notes.txt").unlink()
    exported = run_fab(inventory, "export-drafter", *step)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert "drafter directory" in refused.stdout  # exported on the host before the pull
    assert "reusing" in exported.stdout and "verified" in exported.stdout
    remote = EvalLayout.exported(
        EvalLayout(load(inventory).eval_hosts["eval"]).staged_checkpoint(4000)
    )
    for name in ("config.json", "model.safetensors", "dflash_export.json"):
        assert (local / name).read_bytes() == (Path(remote) / name).read_bytes()
    served = run_fab(inventory, "served-eval", "--step", "4000", "--host", "eval", *QUICK)
    assert served.returncode == 0, served.stdout + served.stderr
    assert "reusing" in served.stdout
    results = load(inventory).local.results
    [record_file] = (results / "served").glob("*/served.json")
    record = json.loads(record_file.read_text())
    assert record["server"]["gpus"] == "1" and record["settings"]["prompts"] == 2
    [launch] = [json.loads(line)["launch"] for line in log.read_text().splitlines()[:1]]
    assert launch["cuda_visible_devices"] == "1"
    assert launch["argv"][launch["argv"].index("--speculative-algorithm") + 1] == "DFLASH"
    assert servers_alive(inventory) == []  # stopped once asked
    cpu = run_fab(inventory, "run-eval", "--step", "4000", "--host", "eval", *QUICK)
    assert cpu.returncode == 0, cpu.stdout + cpu.stderr
    [run_file] = results.glob("*/run.json")
    rows = json.loads((run_file.parent / "results.json").read_text())["per_prompt"]
    in_sglangs_count = [
        r["completion_tokens"] * r["tau_capped"] / (r["completion_tokens"] - 1) for r in rows
    ]
    assert [row["tau"] for row in record["per_prompt"]] == pytest.approx(in_sglangs_count)


def test_a_busy_gpu_or_a_taken_port_is_refused_in_one_line(served_lab, e2e_lab):
    inventory, bin_dir, _ = served_lab
    (bin_dir / "apps").write_text("GPU-bbbb, 4242\n")  # a process on GPU 1
    busy = run_fab(inventory, "served-eval", "--step", "2000", "--host", "eval", *QUICK)
    assert busy.returncode == 1
    assert "GPU 1 is busy (processes 4242)" in busy.stderr and "Traceback" not in busy.stderr
    (bin_dir / "apps").write_text("GPU-aaaa, 4242\n")  # another GPU's process: no matter
    document = yaml.safe_load(inventory.read_text())
    first = int(document["hosts"]["eval"]["sglang"]["ports"].split("-")[0])
    document["hosts"]["eval"]["sglang"]["ports"] = f"{first}-{first}"
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    holder = subprocess.Popen(
        e2e_lab.in_namespace("eval", ["python3", "-c", LISTEN, str(first)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "listening"
        taken = run_fab(inventory, "served-eval", "--step", "2000", "--host", "eval", *QUICK)
    finally:
        holder.terminate()
        holder.wait(timeout=30)
    assert taken.returncode == 1
    assert f"port {first} (sglang.ports) is taken" in taken.stderr
    assert servers_alive(inventory) == []


LISTEN = (
    "import socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',int(sys.argv[1])))\n"
    "s.listen()\nprint('listening',flush=True)\ntime.sleep(600)\n"
)


def test_ctrl_c_leaves_no_server(served_lab):
    inventory, _, _ = served_lab
    running = start_fab(inventory, "served-eval", "--step", "2000", "--host", "eval", *QUICK)
    deadline = time.monotonic() + 240
    while not servers_alive(inventory):  # the server started: Ctrl-C now
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "no server started"
        time.sleep(0.2)
    os.killpg(running.pid, signal.SIGINT)
    running.communicate(timeout=120)
    assert running.returncode == 130
    assert servers_alive(inventory) == []
