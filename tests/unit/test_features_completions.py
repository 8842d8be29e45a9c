"""Where `fab extract-features`' completions come from: `--completions`, declared once in the
option table as run-eval's, with run-eval's default (the host's SGLang server when it has an
`sglang_url`). Unit tier: the inventory and fab in-process; every refusal here comes before
a host is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dflash_eval.contract import options as table

from dflash_ops.core import inventory
from dflash_ops.core.errors import HostError
from dflash_ops.evaluation.request import completions_server
from tests.inventory_documents import features_host, minimal_document

URL = "http://127.0.0.1:30000"


def inventory_file(tmp_path, **fields) -> Path:
    document = minimal_document()
    document["hosts"]["gpu"] = features_host(**fields)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_extract_features_takes_run_evals_completions_option():
    import inspect

    import fabfile

    assert "completions" in inspect.signature(fabfile.extract_features.body).parameters
    assert table.EXTRACT_FEATURES in table.BY_NAME["completions"].tasks


def test_a_features_host_with_an_sglang_url_uses_it_unless_told_local(tmp_path):
    name, entry = inventory.load(inventory_file(tmp_path, sglang_url=URL)).features_host(None)
    assert completions_server(None, name, entry) == URL
    assert completions_server("sglang", name, entry) == URL
    assert completions_server("local", name, entry) is None


def test_without_an_sglang_url_completions_are_local_and_sglang_is_refused(tmp_path):
    name, entry = inventory.load(inventory_file(tmp_path)).features_host(None)
    assert completions_server(None, name, entry) is None
    with pytest.raises(HostError, match=r"^gpu: --completions sglang needs `sglang_url`"):
        completions_server("sglang", name, entry)


def test_extract_features_refuses_sglang_without_a_url_before_any_host(tmp_path, fab):
    layers = ("--layers", "1", "--block-size", "8")
    done = fab(inventory_file(tmp_path), "extract-features", *layers, "--completions", "sglang")
    assert done.returncode == 1
    assert "gpu: --completions sglang needs `sglang_url` for this host" in done.stderr
    assert "Traceback" not in done.stderr


def test_extract_features_no_longer_takes_sglang(tmp_path, fab):
    done = fab(inventory_file(tmp_path, sglang_url=URL), "extract-features", "--sglang")
    assert done.returncode != 0
    assert "--sglang" in done.stderr + done.stdout
