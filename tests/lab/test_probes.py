"""Probe parsers on captured output, then each probe's command once against a real lab host."""

from __future__ import annotations

import subprocess

import pytest

from dflash_lab.lab import LabConfig
from dflash_ops.core.containers import DockerContainer, PctContainer, RootfsContainer
from dflash_ops.core.units import parse_size
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.remote.probes import FileStat, ProbeParseError


def test_parse_df_avail():
    assert probes.parse_df_avail("    Avail\n268435456\n") == 268435456
    with pytest.raises(ProbeParseError, match="unexpected df output"):
        probes.parse_df_avail("df: /nope: No such file or directory\n")


def test_parse_file_stat():
    assert probes.parse_file_stat("4194304 1764428000 regular file\n") == FileStat(
        4194304, 1764428000, "regular file"
    )
    assert probes.parse_file_stat("missing\n") is None
    with pytest.raises(ProbeParseError):
        probes.parse_file_stat("stat: cannot stat\n")


def test_parse_tools():
    captured = (
        "uv\t/root/.local/bin/uv\tuv 0.13.9\n"
        "sha256sum\t/usr/bin/sha256sum\tsha256sum (GNU coreutils) 9.1\n"
        "pct\t\t\n"
    )
    found = probes.parse_tools(captured)
    assert found["uv"].version == "uv 0.13.9" and found["uv"].present
    assert not found["pct"].present and found["pct"].version is None


def _section(name: str, body: str) -> str:
    return f"\n{probes.SECTION_MARK} {name}\n{body}"


def test_parse_paths_info():
    probe = probes.paths_info(["/a", "/b c"])
    captured = (
        _section("stat0", "4096 1764428000 directory\n")
        + _section("free0", "    Avail\n1000\n")
        + _section("stat1", "missing\n")
        + _section("free1", "Avail\n2000\n")
    )
    info = probe.parse(captured)
    assert info["/a"] == probes.PathInfo(FileStat(4096, 1764428000, "directory"), 1000)
    assert info["/b c"] == probes.PathInfo(None, 2000)
    assert "'/b c'" in probe.command
    with pytest.raises(ProbeParseError, match="no answer for stat1, free1"):
        probe.parse(_section("stat0", "missing\n") + _section("free0", "Avail\n1\n"))


def test_together_keeps_answers_apart_whatever_they_print():
    """A probe printing nothing, or no final newline, or a look-alike marker, stays its own."""
    echo = probes.Probe("printf 'no newline'", str)
    silent = probes.Probe("true", str)
    probe = probes.together(first=echo, second=silent, third=probes.Probe("echo x", str))
    output = subprocess.run(["bash", "-c", probe.command], capture_output=True, text=True).stdout
    assert probe.parse(output) == {"first": "no newline", "second": "", "third": "x\n"}


def test_parse_machine():
    captured = "16\nMemTotal:       131072000 kB\nMemAvailable:   120000000 kB\n"
    assert probes.parse_machine(captured) == probes.Machine(16, 131072000 * 1024, 120000000 * 1024)
    with pytest.raises(ProbeParseError):
        probes.parse_machine("nproc: not found\n")


def test_container_status_parsers():
    pct = environment_of(PctContainer(kind="pct", id=200)).status()
    docker = environment_of(DockerContainer(kind="docker", name="trainer")).status()
    assert pct.command == "pct status 200"
    assert pct.parse("status: running\n")
    assert not pct.parse("status: stopped\n")
    assert docker.parse("running\n")
    assert not docker.parse("exited\n")
    assert environment_of(RootfsContainer(kind="rootfs", path="/r")).status() is None


def test_probes_on_a_real_host(lab, inventory):
    host = Host(inventory, "eval")
    data = str(lab.data_dir("eval"))
    weird = lab.data_dir("eval") / 'it\'s a "file" with spaces'
    try:
        free = host.probe(probes.free_bytes(data))
        assert 0 < free <= parse_size(LabConfig().eval_disk)  # the eval host's tmpfs
        # A path that does not exist yet is measured where it will be created.
        assert abs(host.probe(probes.free_bytes(f"{data}/not/yet/there")) - free) < 1 << 20
        weird.write_bytes(b"12345")
        stat = host.probe(probes.file_stat(str(weird)))
        assert (stat.size, stat.kind) == (5, "regular file")
        assert host.probe(probes.file_stat(f"{data}/absent")) is None
        tools = host.probe(probes.tools(["sha256sum", "no-such-tool-xyz"]))
        assert tools["sha256sum"].present and "coreutils" in tools["sha256sum"].version
        assert not tools["no-such-tool-xyz"].present
        machine = host.probe(probes.machine())
        assert machine.cpus >= 1 and 0 < machine.memory_available <= machine.memory_total
    finally:
        weird.unlink(missing_ok=True)
        host.close()


def test_transformers_support_is_read_from_the_last_json_line():
    parse = probes.parse_transformers_support
    warned = 'some warning on stdout\n{"version": "5.24.0", "model_type": "qwen3_5"}\n'
    assert parse(warned) == probes.TransformersSupport("5.24.0", "qwen3_5", None)
    refused = '{"version": "4.40.0", "error": "model type qwen3_5 not recognized"}'
    assert parse(refused).error == "model type qwen3_5 not recognized"
    assert parse("").error == "the venv's python did not answer"


def test_transformers_support_runs_a_real_python(tmp_path):
    """The probe's command against this machine's own python (the suite's transformers)."""
    from transformers import Qwen3Config

    Qwen3Config(num_hidden_layers=2).save_pretrained(str(tmp_path / "t"))
    import sys

    probe = probes.transformers_support(sys.executable, str(tmp_path / "t"))
    answer = probe.parse(
        subprocess.run(["sh", "-c", probe.command], capture_output=True, text=True).stdout
    )
    assert (answer.model_type, answer.error) == ("qwen3", None)
    (tmp_path / "t" / "config.json").write_text('{"model_type": "qwen9_future"}')
    answer = probe.parse(
        subprocess.run(["sh", "-c", probe.command], capture_output=True, text=True).stdout
    )
    assert answer.model_type is None and "qwen9_future" in answer.error
