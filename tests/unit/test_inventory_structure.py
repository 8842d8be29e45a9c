"""Inventory structure, bounds and defaults: every malformed file ends in one clear line
`file: key: expected …, found …` (never a traceback), and what a file leaves out gets the
documented default."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dflash_ops.core import inventory
from dflash_ops.core.errors import InventoryError
from dflash_ops.evaluation.harness_command import drafter_profile
from tests.inventory_documents import minimal_document


def minimal() -> dict:
    """The fewest keys an inventory can have: everything else is a default."""
    return minimal_document()


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "inv.yaml"
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return path


def load(tmp_path: Path, document: object) -> inventory.Inventory:
    return inventory.load(write(tmp_path, document))


def error_for(tmp_path: Path, document: object) -> str:
    path = write(tmp_path, document)
    with pytest.raises(InventoryError) as raised:
        inventory.load(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


def with_host(host: str, **changes) -> dict:
    document = minimal()
    document["hosts"][host].update(changes)
    return document


def with_venv(**changes) -> dict:
    document = minimal()
    document["hosts"]["eval"]["venv"].update(changes)
    return document


# --- defaults -------------------------------------------------------------------------------


def test_defaults_of_hosts(tmp_path):
    inv = load(tmp_path, minimal())
    for host in (inv.trainer, inv.eval_host(None)[1]):
        # no port: the ssh config's Port for the address applies (else 22)
        assert host.port is None and host.connect_timeout == 10 and host.user is None
        assert host.known_hosts == "~/.ssh/known_hosts" and host.identity_file is None
    trainer = inv.trainer
    assert trainer.container is None and trainer.complete_marker is None
    assert trainer.layout == "step_{step}/checkpoint.pt" and trainer.tmp_dir == "/var/tmp"
    name, entry = inv.eval_host(None)
    assert name == "eval" and entry.threads is None and entry.checkpoints is None
    assert entry.reference_drafter is None and entry.sglang_url is None


def test_defaults_of_the_venv(tmp_path):
    venv = load(tmp_path, minimal()).eval_host(None)[1].venv
    assert (venv.python, venv.torch, venv.min_free) == ("3.12", "cpu", "2g")
    assert venv.versions == {} and venv.packages == []
    assert venv.find_links is None and venv.extra_index_url is None
    assert venv.offline is False and venv.wheelhouse is False
    assert venv.uv_dir is None and venv.cache_dir is None


def test_defaults_of_the_other_sections(tmp_path):
    inv = load(tmp_path, minimal())
    assert inv.transfer.margin == "1g" and inv.transfer.margin_fraction == 0.02
    assert inv.local.staging is None and inv.local.results == tmp_path / "results"
    assert inv.ssh_config is None and inv.lab is None
    assert inv.path == tmp_path / "inv.yaml"


def test_offline_and_wheelhouse_are_read(tmp_path):
    venv = load(tmp_path, with_venv(offline=True, wheelhouse=True)).eval_host(None)[1].venv
    assert venv.offline is True and venv.wheelhouse is True
    message = error_for(tmp_path, with_venv(offline="yes"))
    assert message == "hosts.eval.venv.offline: expected a valid boolean, found 'yes' (a string)"


def test_a_transfer_section_is_read(tmp_path):
    document = {**minimal(), "transfer": {"margin": "3g", "margin_fraction": 0.1}}
    transfer = load(tmp_path, document).transfer
    assert transfer.margin == "3g" and transfer.margin_fraction == 0.1
    assert load(tmp_path, {**minimal(), "transfer": {"margin": 1000}}).transfer.margin == 1000
    message = error_for(tmp_path, {**minimal(), "transfer": {"margn": "1g"}})
    assert message.startswith("transfer.margn: unknown key (did you mean 'margin'?)")


def test_local_paths_are_relative_to_the_inventory_file(tmp_path):
    document = {**minimal(), "local": {"staging": "stage", "results": "/abs/results"}}
    inv = load(tmp_path, document)
    assert inv.local.staging == tmp_path / "stage"
    assert inv.local.results == Path("/abs/results")


# --- bounds ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "key", "good", "bad", "expected"),
    [
        ("trainer", "port", [1, 65535], 0, "greater than or equal to 1"),
        ("eval", "port", [1, 65535], 65536, "less than or equal to 65535"),
        ("eval", "connect_timeout", [1], 0, "greater than or equal to 1"),
        ("eval", "threads", [1, 64], 0, "greater than or equal to 1"),
    ],
)
def test_host_bounds(tmp_path, host, key, good, bad, expected):
    for value in good:
        assert getattr(load(tmp_path, with_host(host, **{key: value})).hosts[host], key) == value
    message = error_for(tmp_path, with_host(host, **{key: bad}))
    assert message == f"hosts.{host}.{key}: expected {expected}, found {bad} (a number)"


def test_margin_fraction_is_between_zero_and_one(tmp_path):
    for value in (0, 1, 0.5):
        document = {**minimal(), "transfer": {"margin_fraction": value}}
        assert load(tmp_path, document).transfer.margin_fraction == value
    for value, expected in ((-0.01, "greater than or equal to 0"), (1.01, "less than or equal")):
        message = error_for(tmp_path, {**minimal(), "transfer": {"margin_fraction": value}})
        assert message.startswith(f"transfer.margin_fraction: expected {expected}")


# --- structure ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("", "expected a mapping with 'hosts', found nothing"),
        ("# only a comment\n", "expected a mapping with 'hosts', found nothing"),
        ("- trainer\n- eval\n", "expected a mapping with 'hosts', found a list"),
        ("just words\n", "expected a mapping with 'hosts', found 'just words' (a string)"),
        ({"local": {}}, "hosts: expected a mapping of host names to host entries, found nothing"),
        (
            {"hosts": {}},
            "hosts: expected a mapping of host names to host entries, found an empty mapping",
        ),
        (
            {"hosts": ["trainer"]},
            "hosts: expected a mapping of host names to host entries, found a list",
        ),
    ],
    ids=["empty", "comment", "list", "scalar", "no-hosts", "hosts-empty", "hosts-list"],
)
def test_the_top_level_shape(tmp_path, document, expected):
    assert error_for(tmp_path, document) == expected


@pytest.mark.parametrize(
    ("entry", "found"),
    [("ct129", "'ct129' (a string)"), (["a"], "a list"), (None, "nothing"), ({}, "")],
    ids=["string", "list", "null", "empty"],
)
def test_a_host_entry_that_is_not_a_mapping(tmp_path, entry, found):
    document = minimal()
    document["hosts"]["eval"] = entry
    message = error_for(tmp_path, document)
    if entry == {}:  # a mapping without a role
        assert message == "hosts.eval.role: expected one of trainer, eval, features, found nothing"
    else:
        assert message == f"hosts.eval: expected a mapping, found {found}"


def test_a_host_name_that_is_not_a_string(tmp_path):
    document = minimal()
    document["hosts"][5] = document["hosts"].pop("eval")
    message = error_for(tmp_path, document)
    assert (
        message == 'hosts: expected host names that are strings, found 5 (a number); quote it: "5"'
    )


def test_a_role_that_is_not_a_string(tmp_path):
    message = error_for(tmp_path, with_host("eval", role=["eval"]))
    assert message == "hosts.eval.role: expected one of trainer, eval, features, found a list"


@pytest.mark.parametrize(
    ("section", "value", "expected"),
    [
        ("transfer", [1], "transfer: expected a mapping, found a list"),
        ("local", "here", "local: expected a mapping, found 'here' (a string)"),
    ],
)
def test_a_section_that_is_not_a_mapping(tmp_path, section, value, expected):
    assert error_for(tmp_path, {**minimal(), section: value}) == expected


def test_nested_values_of_the_wrong_shape(tmp_path):
    assert (
        error_for(tmp_path, with_host("eval", venv="/v"))
        == "hosts.eval.venv: expected a mapping, found '/v' (a string)"
    )
    assert (
        error_for(tmp_path, with_venv(versions=["torch"]))
        == "hosts.eval.venv.versions: expected a mapping, found a list"
    )
    assert (
        error_for(tmp_path, with_venv(packages="numpy"))
        == "hosts.eval.venv.packages: expected a list, found 'numpy' (a string)"
    )


def test_a_container_without_kind_or_as_a_word(tmp_path):
    assert (
        error_for(tmp_path, with_host("trainer", container={"id": 200}))
        == "hosts.trainer.container.kind: required key is missing (one of pct, rootfs, docker)"
    )
    assert (
        error_for(tmp_path, with_host("trainer", container="pct"))
        == "hosts.trainer.container: expected a mapping, found 'pct' (a string)"
    )


def test_an_error_inside_a_container_names_its_key(tmp_path):
    message = error_for(tmp_path, with_host("trainer", container={"kind": "pct", "id": "x"}))
    assert message == "hosts.trainer.container.id: expected a valid integer, found 'x' (a string)"
    message = error_for(
        tmp_path, with_host("trainer", container={"kind": "rootfs", "path": "/r", "name": "c"})
    )
    assert message == "hosts.trainer.container.name: unknown key; allowed here: kind, path"


def test_several_errors_are_one_line_each(tmp_path):
    message = error_for(tmp_path, with_host("eval", port=0, threads=0))
    path = tmp_path / "inv.yaml"
    assert message.splitlines() == [
        "hosts.eval.port: expected greater than or equal to 1, found 0 (a number)",
        f"{path}: hosts.eval.threads: expected greater than or equal to 1, found 0 (a number)",
    ]


def test_path_is_not_a_key_of_the_file(tmp_path):
    message = error_for(tmp_path, {**minimal(), "path": "/elsewhere.yaml"})
    assert message == "path: unknown key at the top level"


def test_top_level_typos_list_what_is_allowed_without_path(tmp_path):
    message = error_for(tmp_path, {**minimal(), "hots": {}})
    assert message == (
        "hots: unknown key (did you mean 'hosts'?); "
        "allowed here: hosts, lab, local, ssh_config, transfer"
    )


# --- the file itself ------------------------------------------------------------------------


def test_a_yaml_error_names_line_and_column(tmp_path):
    message = error_for(tmp_path, "hosts:\n  trainer: {role: trainer}\n eval: x\n")
    assert message.startswith("line 3, column 2: not valid YAML: ")
    message = error_for(tmp_path, "hosts:\n\ttrainer: x\n")
    assert message.startswith("line 2, column 1: not valid YAML: found character '\\t'")


def test_a_control_character_is_named_with_its_offset(tmp_path):
    message = error_for(tmp_path, b"hosts: \x00\n")
    assert message.startswith("offset 7: not valid YAML: character #x0000 (")


def test_a_file_that_is_not_text(tmp_path):
    message = error_for(tmp_path, b"# inventory\nhosts:\xff\xfe\n")
    assert message == "line 2: expected UTF-8 text, found the byte 0xff; save the file as UTF-8"


def test_an_unreadable_path(tmp_path):
    with pytest.raises(InventoryError) as raised:
        inventory.load(tmp_path)
    assert str(raised.value) == f"{tmp_path}: cannot read inventory: Is a directory"


def test_an_eval_host_is_chosen_by_name_or_alone(tmp_path):
    inv = load(tmp_path, minimal())
    assert inv.eval_host("eval")[0] == "eval" and inv.trainer_name == "trainer"
    assert list(inv.eval_hosts) == ["eval"]
    with pytest.raises(InventoryError, match="no eval host named 'trainer'; eval hosts: eval"):
        inv.eval_host("trainer")


# --- rules added with the hostile-input work (their fab-level tests need a lab) -------------


@pytest.mark.parametrize("address", ["kpro6", "ct129.lan", "10.231.0.2", "fe80::1%veth0", "a_b"])
def test_plain_addresses_are_accepted(tmp_path, address):
    assert load(tmp_path, with_host("eval", address=address)).hosts["eval"].address == address


@pytest.mark.parametrize("address", ["host;rm -rf ~", "-oProxyCommand=x", "a b", "$(id)", ""])
def test_addresses_a_shell_would_read_are_refused(tmp_path, address):
    message = error_for(tmp_path, with_host("eval", address=address))
    assert message.startswith("hosts.eval.address: expected a host name, ssh-config alias or IP")


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("step_{step/checkpoint.pt", " (unbalanced braces)"),
        ("step_{steps}/checkpoint.pt", ""),
        ("step_{step}/{step}.pt", ""),
        ("checkpoint.pt", ""),
    ],
)
def test_a_layout_names_the_step_once_and_nothing_else(tmp_path, layout, why):
    message = error_for(tmp_path, with_host("trainer", layout=layout))
    expected = "a path with {step} exactly once and no other {…} placeholder" + why
    assert message.startswith(f"hosts.trainer.layout: expected {expected}, found ")
    marker = load(tmp_path, with_host("trainer", complete_marker="step_{step}/DONE"))
    assert marker.trainer.complete_marker == "step_{step}/DONE"


def test_drafter_profile_bounds(tmp_path):
    profile = {"block_size": 2, "num_target_layers": 1, "mask_token_id": 0}
    loaded = load(tmp_path, with_host("trainer", drafter=profile)).trainer.drafter
    assert (loaded.block_size, loaded.num_target_layers, loaded.mask_token_id) == (2, 1, 0)
    for key, bad, bound in (
        ("block_size", 1, 2),
        ("num_target_layers", 0, 1),
        ("mask_token_id", -1, 0),
    ):
        message = error_for(tmp_path, with_host("trainer", drafter={key: bad}))
        assert message == (
            f"hosts.trainer.drafter.{key}: expected greater than or equal to {bound}, "
            f"found {bad} (a number)"
        )


def test_a_drafter_profile_passes_accept_keys_to_the_harness(tmp_path):
    inventory = load(tmp_path, with_host("trainer", drafter={"accept_keys": ["draft_vocab_size"]}))
    assert drafter_profile(inventory) == {"accept_keys": ["draft_vocab_size"]}


def test_keepalive_default_and_bound(tmp_path):
    assert load(tmp_path, minimal()).transfer.keepalive == 15
    assert load(tmp_path, {**minimal(), "transfer": {"keepalive": 1}}).transfer.keepalive == 1
    message = error_for(tmp_path, {**minimal(), "transfer": {"keepalive": 0}})
    assert message == "transfer.keepalive: expected greater than or equal to 1, found 0 (a number)"


def test_a_duplicate_key_names_both_lines(tmp_path):
    text = yaml.safe_dump(minimal()) + "hosts: {}\n"
    first = text.splitlines().index("hosts:") + 1
    second = len(text.splitlines())
    message = error_for(tmp_path, text)
    assert message.startswith(f"line {second}, column 1: not valid YAML: duplicate key 'hosts'")
    assert f"(first at line {first})" in message
