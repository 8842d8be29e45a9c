"""Hosts named by an ssh-config alias: `ssh -G` tells where ssh goes (HostName, Port,
ProxyJump), check-hosts probes that, and a lab inventory's alias may lead only to the lab."""

from __future__ import annotations

import pytest
import yaml

from dflash_ops.core.errors import HostError, LabError
from dflash_ops.core.inventory import load
from dflash_ops.remote import checks
from dflash_ops.remote.checks import Status
from dflash_ops.remote.connection import Host
from dflash_ops.remote.ssh_config import Endpoint, parse_ssh_g, resolve

# Captured from OpenSSH 9 (`ssh -G bastioned`), shortened to the lines that matter and a few
# that must not be mistaken for them.
CAPTURED = """\
user deploy
hostname 10.1.2.3
port 2222
addressfamily any
proxyjump jump@bastion:22
proxycommand none
hostkeyalias none
"""


def test_the_parser_reads_where_ssh_goes():
    endpoint = parse_ssh_g(CAPTURED, "bastioned")
    assert endpoint == Endpoint("10.1.2.3", 2222, "ProxyJump jump@bastion:22")
    assert str(endpoint) == "10.1.2.3:2222"


def test_the_parser_treats_proxy_none_as_direct_and_falls_back_to_the_alias():
    assert parse_ssh_g("port 22\nproxyjump none\n", "plain") == Endpoint("plain", 22, None)


def write_config(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_resolve_applies_host_blocks_and_lets_the_inventory_port_win(tmp_path):
    config = write_config(tmp_path / "config", "Host trainbox\n  HostName 10.9.8.7\n  Port 2200\n")
    assert resolve("trainer", "trainbox", None, config) == Endpoint("10.9.8.7", 2200)
    assert resolve("trainer", "trainbox", 22, config) == Endpoint("10.9.8.7", 22)
    assert resolve("trainer", "other", None, config) == Endpoint("other", 22)
    proxied = write_config(tmp_path / "proxied", "Host far\n  ProxyCommand nc %h %p\n")
    assert resolve("eval", "far", None, proxied).proxy == "ProxyCommand nc %h %p"


def test_a_config_ssh_rejects_is_an_error_naming_the_host(tmp_path):
    broken = write_config(tmp_path / "broken", "Host x\n  NoSuchOption yes\n")
    with pytest.raises(HostError) as caught:
        resolve("eval", "x", None, broken)
    assert caught.value.host == "eval"
    assert "ssh cannot read its config for x" in str(caught.value)


def offline_inventory(tmp_path, config_text: str, address: str):
    """An inventory that is not the lab's: only used where no connection is ever made."""
    document = {
        "ssh_config": write_config(tmp_path / "ssh_config", config_text),
        "hosts": {
            "trainer": {"role": "trainer", "address": address, "checkpoints": "/ckpt"},
            "eval": {
                "role": "eval",
                "address": address,
                "workdir": "/w",
                "venv": {"path": "/v"},
                "target_model": "/m",
            },
        },
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return load(path)


def test_behind_a_proxy_jump_check_hosts_does_not_probe_tcp(tmp_path):
    inventory = offline_inventory(
        tmp_path, "Host inside\n  HostName 10.0.0.9\n  ProxyJump gate.invalid\n", "inside"
    )
    row = checks.reachability(Host(inventory, "eval"))
    assert row.status is Status.INFO
    assert row.detail == "inside → 10.0.0.9:22 via ProxyJump gate.invalid"


def test_a_name_that_does_not_resolve_says_so(tmp_path):
    # A label over 63 characters fails in the resolver library itself: no DNS query is sent.
    unresolvable = "x" * 70 + ".example"
    inventory = offline_inventory(tmp_path, f"Host box\n  HostName {unresolvable}\n", "box")
    row = checks.reachability(Host(inventory, "trainer"))
    assert row.status is Status.FAIL
    assert f"box → {unresolvable} does not resolve" in row.detail
    assert "Host/HostName entry in your ssh config" in row.detail


def alias_lab_inventory(lab, tmp_path, extra: str = "") -> str:
    """The lab's inventory with each host named by an alias from an ssh config (no port in the
    inventory: the config's Port applies)."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    blocks = []
    for name, host in document["hosts"].items():
        blocks.append(
            f"Host {name}-alias\n  HostName {host['address']}\n  Port {host.get('port', 22)}\n"
        )
        host["address"] = f"{name}-alias"
        host.pop("port", None)
    document["ssh_config"] = write_config(tmp_path / "ssh_config", "".join(blocks) + extra)
    path = tmp_path / "alias-inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def test_lab_hosts_named_by_alias_are_checked_listed_and_staged(make_lab, tmp_path, fab):
    lab = make_lab(steps=(4000,), checkpoint_size="1m")
    inventory_path = alias_lab_inventory(lab, tmp_path)
    rows = checks.check_inventory(load(inventory_path))
    by_check = {(row.host, row.check): row for row in rows}
    for name in ("trainer", "eval"):
        reachable = by_check[(name, "reachable")]
        assert reachable.status is Status.OK, reachable
        assert reachable.detail.startswith(f"{name}-alias → ")
        assert by_check[(name, "authenticated")].status is Status.OK
    assert "no (transfers relay" in by_check[("trainer", "reaches eval")].detail
    assert not checks.failed(rows)
    listed = fab(inventory_path, "list-checkpoints")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    staged = fab(inventory_path, "stage-checkpoint", "--step", "4000")  # OpenSSH's side too
    assert staged.returncode == 0, staged.stdout + staged.stderr
    checkpoint = lab.data_dir("eval") / "eval" / "checkpoints" / "step_4000" / "checkpoint.pt"
    assert checkpoint.stat().st_size == 1 << 20


def test_a_lab_alias_that_leads_outside_the_lab_is_refused_before_connecting(lab, tmp_path):
    inventory_path = alias_lab_inventory(lab, tmp_path)
    config = tmp_path / "ssh_config"
    config.write_text(
        config.read_text().replace(
            "Host eval-alias\n", "Host eval-alias\n  HostName 127.0.0.2\n", 1
        )
    )
    host = Host(load(inventory_path), "eval")
    with pytest.raises(LabError, match=r"resolves to 127\.0\.0\.2:"):
        host.run("true")
    assert "connection" not in host.__dict__
