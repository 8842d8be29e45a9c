"""Inventory validation: every error names the file, the key path, expected and found."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from dflash_ops.core import inventory
from dflash_ops.core.containers import DockerContainer, PctContainer, RootfsContainer
from dflash_ops.core.errors import InventoryError
from dflash_ops.remote.layout import EvalLayout

EXAMPLE = Path(__file__).resolve().parents[2] / "inventory.yaml"


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def error_for(tmp_path: Path, document: dict | str) -> str:
    path = tmp_path / "inv.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    with pytest.raises(InventoryError) as raised:
        inventory.load(path)
    return str(raised.value)


def test_example_inventory_loads():
    inv = inventory.load(EXAMPLE)
    assert inv.trainer_name == "trainer"
    assert inv.trainer.container == PctContainer(
        kind="pct", id=200, rootfs="/scratch/containers/subvol-200-disk-0"
    )
    assert inv.trainer.layout.format(step=4000) == "step_4000/checkpoint.pt"
    name, entry = inv.eval_host(None)
    assert (name, entry.venv.python) == ("eval", "3.12")
    assert EvalLayout(entry).staging == "/root/eval/checkpoints"
    assert inv.local.results == EXAMPLE.parent / "results"


def test_path_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_INVENTORY", str(tmp_path / "env.yaml"))
    assert inventory.resolve_path("explicit.yaml") == Path("explicit.yaml")
    assert inventory.resolve_path(None) == tmp_path / "env.yaml"
    monkeypatch.delenv("DFLASH_INVENTORY")
    assert inventory.resolve_path(None) == Path("inventory.yaml")


def test_missing_file_says_how_to_fix(tmp_path):
    with pytest.raises(InventoryError, match=r"nope\.yaml: inventory not found.*--inventory"):
        inventory.load(tmp_path / "nope.yaml")


def test_malformed_yaml_names_line(tmp_path):
    message = error_for(tmp_path, "hosts:\n  trainer: [unclosed\n")
    assert "inv.yaml: line 3" in message and "not valid YAML" in message


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["hosts"]["trainer"].update(adress="x"),
            "hosts.trainer.adress: unknown key (did you mean 'address'?)",
        ),
        (
            lambda d: d["hosts"]["eval"]["venv"].update(pyhton="3.12"),
            "hosts.eval.venv.pyhton: unknown key (did you mean 'python'?); allowed here: ",
        ),
        (lambda d: d.update(locl={}), "locl: unknown key (did you mean 'local'?)"),
        (
            lambda d: d["hosts"]["trainer"].pop("checkpoints"),
            "hosts.trainer.checkpoints: required key is missing",
        ),
        (
            lambda d: d["hosts"]["eval"]["venv"].update(python=3.12),
            'hosts.eval.venv.python: expected a string, found 3.12 (a number); quote it: "3.12"',
        ),
        (
            lambda d: d["hosts"]["trainer"].update(port="ssh"),
            "hosts.trainer.port: expected a valid integer, found 'ssh' (a string)",
        ),
        (
            lambda d: d["hosts"]["trainer"].update(port=70000),
            "hosts.trainer.port: expected less than or equal to 65535, found 70000",
        ),
        (
            lambda d: d["hosts"]["trainer"].update(container={"kind": "lxc", "id": 1}),
            "hosts.trainer.container.kind: expected one of pct, rootfs, docker, found 'lxc'",
        ),
        (
            lambda d: d["hosts"]["trainer"].update(container={"kind": "docker"}),
            "hosts.trainer.container.name: required key is missing",
        ),
        (
            lambda d: d["hosts"]["trainer"].update(
                container={"kind": "docker", "name": "t", "rootfs": "/x"}
            ),
            "hosts.trainer.container.rootfs: unknown key; allowed here: kind, name",
        ),
        (
            lambda d: d["hosts"]["eval"].update(role="evaluator"),
            "hosts.eval.role: expected one of trainer, eval, features, found 'evaluator'",
        ),
        (lambda d: d["hosts"]["eval"].update(role="trainer"), "hosts.eval.workdir: unknown key"),
        (lambda d: d["hosts"].pop("eval"), "hosts: expected at least one host with role: eval"),
        (lambda d: d.update(hosts=[]), "hosts: expected a mapping of host names"),
    ],
)
def test_schema_errors_name_the_key(tmp_path, mutate, expected):
    document = copy.deepcopy(example())
    mutate(document)
    message = error_for(tmp_path, document)
    assert message.startswith(f"{tmp_path / 'inv.yaml'}: ")
    assert expected in message


def test_typo_fails_with_one_line(tmp_path):
    document = example()
    document["hosts"]["trainer"]["layuot"] = "x"
    assert len(error_for(tmp_path, document).splitlines()) == 1


def test_two_trainers_rejected(tmp_path):
    document = example()
    document["hosts"]["trainer2"] = copy.deepcopy(document["hosts"]["trainer"])
    assert "exactly one host with role: trainer, found 2" in error_for(tmp_path, document)


def test_every_container_kind_and_none(tmp_path):
    kinds = {
        "pct": ({"kind": "pct", "id": 200}, PctContainer),
        "rootfs": ({"kind": "rootfs", "path": "/srv/ct"}, RootfsContainer),
        "docker": ({"kind": "docker", "name": "trainer"}, DockerContainer),
    }
    for spec, model in kinds.values():
        document = example()
        document["hosts"]["trainer"]["container"] = spec
        path = tmp_path / "inv.yaml"
        path.write_text(yaml.safe_dump(document))
        assert isinstance(inventory.load(path).trainer.container, model)
    document = example()
    del document["hosts"]["trainer"]["container"]
    path.write_text(yaml.safe_dump(document))
    assert inventory.load(path).trainer.container is None


def test_several_eval_hosts_need_a_choice(tmp_path):
    document = example()
    document["hosts"]["eval2"] = {**document["hosts"]["eval"], "address": "ct130"}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(document))
    inv = inventory.load(path)
    assert list(inv.eval_hosts) == ["eval", "eval2"]
    assert inv.eval_host("eval2")[1].address == "ct130"
    with pytest.raises(InventoryError, match=r"several eval hosts.*--host"):
        inv.eval_host(None)
    with pytest.raises(InventoryError, match="no eval host named 'ct9'; eval hosts: eval, eval2"):
        inv.eval_host("ct9")


def test_example_names_hosts_not_addresses():
    """Network safety: the committed example must never hold an IP address to connect to."""
    for entry in example()["hosts"].values():
        assert not entry["address"].replace(".", "").isdigit(), entry["address"]
        assert ":" not in entry["address"]


def test_typo_via_fab_is_one_clear_line(tmp_path, fab):
    document = example()
    document["hosts"]["eval"]["wokdir"] = document["hosts"]["eval"].pop("workdir")
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(document))
    result = fab(path, "check-hosts", "-v")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "hosts.eval.wokdir: unknown key (did you mean 'workdir'?)" in result.stderr
