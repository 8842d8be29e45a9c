"""The one-trip provisioning state: the multi-section probe's command run by a real shell on
a directory tree laid out like an eval host, and its parser on captured output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dflash_ops.core.inventory import EvalHost
from dflash_ops.provision.packages import requested
from dflash_ops.provision.state import ADOPTED, RECORD_FORMAT, host_state, origin, venv_problem
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.probes import SECTION_MARK

SHORT = "0123456789abcdef"


def eval_entry(root: Path) -> EvalHost:
    return EvalHost(
        role="eval",
        address="eval.invalid",
        workdir=str(root / "eval"),
        venv={"path": str(root / "venv")},
        target_model="/m",
    )


def section(name: str, body: str) -> str:
    return f"\n{SECTION_MARK} {name}\n{body}"


CAPTURED = (
    section(
        "record",
        '{"format": 1, "requested": {}, "resolved": {"torch": "2.13.0+cpu", "hf-xet": "1.6.0"}}',
    )
    + section("found", "venv\n")
    + section("python", "3.11.2\n")
    + section("dists", "hf_xet-1.6.0.dist-info\ntorch-2.13.0+cpu.dist-info\n")
    + section("uv", "/srv/eval/bin/uv\nuv 0.13.9 (x86_64-unknown-linux-gnu)\n")
    + section("harness", f"{SHORT}\ncomplete\n")
)


def test_parse_state_on_captured_output(tmp_path):
    entry = eval_entry(tmp_path)
    state = host_state(EvalLayout(entry), SHORT).parse(CAPTURED)
    assert state.python_version == "3.11.2"
    assert (state.found, origin(state)) == ("venv", "tool")
    assert state.dists == {"hf-xet": "1.6.0", "torch": "2.13.0+cpu"}
    assert state.uv == "/srv/eval/bin/uv"
    assert state.uv_version == "uv 0.13.9 (x86_64-unknown-linux-gnu)"
    assert (state.harness_current, state.harness_complete) == (SHORT, True)
    assert "spec changed" in venv_problem(state, entry)
    state.record["requested"] = requested(entry.venv)
    assert venv_problem(state, entry) is None
    state.dists.pop("torch")
    assert "differ from the record (torch 2.13.0+cpu" in venv_problem(state, entry)
    state.python_version = None
    assert "does not run" in venv_problem(state, entry)


def test_state_command_reads_a_host_laid_out_as_provisioned(tmp_path):
    """The command, run by bash on a tree shaped like a provisioned host, answers every
    section, and exits 0 (Host.probe refuses a failed command)."""
    entry = eval_entry(tmp_path)
    layout = EvalLayout(entry)
    site = Path(layout.venv) / "lib" / "python3.11" / "site-packages"
    (site / "torch-2.13.0+cpu.dist-info").mkdir(parents=True)
    (site / "torch").mkdir()
    Path(layout.python).parent.mkdir(parents=True)
    Path(layout.python).symlink_to(sys.executable)
    (Path(layout.venv) / "pyvenv.cfg").write_text("home = /usr/bin\n")
    record = {"format": RECORD_FORMAT, "requested": requested(entry.venv), "resolved": {}}
    Path(layout.provision_record).write_text(json.dumps(record))
    uv = Path(layout.uv_dir) / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_text("#!/bin/sh\necho 'uv 0.0.0 (stand-in)'\n")
    uv.chmod(0o755)
    (Path(layout.harness_root) / SHORT).mkdir(parents=True)
    (Path(layout.harness_root) / SHORT / ".complete").write_text("digest\n")
    Path(layout.harness_current).symlink_to(SHORT)

    probe = host_state(layout, SHORT)
    ran = subprocess.run(["bash", "-c", probe.command], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    state = probe.parse(ran.stdout)
    assert state.record == record
    assert state.python_version == sys.version.split()[0]
    assert state.dists == {"torch": "2.13.0+cpu"}
    assert (state.uv, state.uv_version) == (str(uv), "uv 0.0.0 (stand-in)")
    assert (state.harness_current, state.harness_complete) == (SHORT, True)
    assert venv_problem(state, entry) is None
    assert (state.found, origin(state)) == ("venv", "tool")

    # The same venv without the tool's record was made by someone else; with an adopted
    # record it is the user's still; a directory without pyvenv.cfg is no venv at all.
    Path(layout.provision_record).write_text(json.dumps({**record, "origin": ADOPTED}))
    assert origin(probe.parse(_run(probe))) == ADOPTED
    Path(layout.provision_record).unlink()
    assert origin(probe.parse(_run(probe))) == "foreign"
    (Path(layout.venv) / "pyvenv.cfg").unlink()
    assert probe.parse(_run(probe)).found == "other"


def _run(probe) -> str:
    ran = subprocess.run(["bash", "-c", probe.command], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_state_command_on_a_bare_host_says_no_venv_yet(tmp_path):
    entry = eval_entry(tmp_path)
    probe = host_state(EvalLayout(entry), SHORT)
    ran = subprocess.run(
        ["bash", "-c", probe.command],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # no uv anywhere
    )
    assert ran.returncode == 0, ran.stderr
    state = probe.parse(ran.stdout)
    assert state.record is None and state.python_version is None and state.dists == {}
    assert state.uv is None
    assert (state.harness_current, state.harness_complete) == ("", False)
    assert venv_problem(state, entry) == "no venv yet"
    assert (state.found, origin(state)) == ("nothing", "nothing")
