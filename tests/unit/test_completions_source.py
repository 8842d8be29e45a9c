"""Where `fab run-eval`'s completions come from: the inventory's SGLang server by default,
the target on the eval host with --completions local (no sshd: the request and the
inventory only)."""

from __future__ import annotations

import pytest
import yaml

from dflash_ops.core import inventory
from dflash_ops.core.errors import HostError, OpsError
from dflash_ops.evaluation.foresee import expected_key
from dflash_ops.evaluation.request import build_request, sglang_url
from tests.inventory_documents import minimal_document

URL = "http://user:s3cret@127.0.0.1:30000/prefix"


def eval_entry(tmp_path, url: str | None):
    document = minimal_document()
    if url:
        document["hosts"]["eval"]["sglang_url"] = url
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return inventory.load(path).eval_host(None)


def request(features: str | None = None, **harness_options):
    return build_request(
        step=1, host=None, harness_options=harness_options, prompts=None, features=features
    )


def test_an_inventory_sglang_url_is_the_default_source(tmp_path):
    name, entry = eval_entry(tmp_path, URL)
    assert sglang_url(request(), name, entry) == URL
    assert sglang_url(request(completions="sglang"), name, entry) == URL
    assert expected_key(request(), from_sglang=True)["completions"] == "sglang"


def test_completions_local_opts_out_and_reaches_the_harness(tmp_path):
    name, entry = eval_entry(tmp_path, URL)
    local = request(completions="local")
    assert sglang_url(local, name, entry) is None
    assert local.harness_args == ["--completions", "local"]


def test_sampled_completions_and_feature_sets_never_ask_the_server_by_default(tmp_path):
    name, entry = eval_entry(tmp_path, URL)
    assert sglang_url(request(temperature="0.7"), name, entry) is None  # the target samples
    assert sglang_url(request(features="latest"), name, entry) is None  # the set has them


def test_without_sglang_url_completions_are_local_and_sglang_is_refused(tmp_path):
    name, entry = eval_entry(tmp_path, None)
    assert sglang_url(request(), name, entry) is None
    with pytest.raises(HostError) as refused:
        sglang_url(request(completions="sglang"), name, entry)
    message = str(refused.value)
    assert message.startswith("eval: --completions sglang needs `sglang_url`")
    assert "--completions local" in message and "\n" not in message


def test_a_completions_value_other_than_sglang_or_local_is_one_line():
    with pytest.raises(
        OpsError, match=r"--completions: expected one of sglang, local, found 'gpu'"
    ):
        request(completions="gpu")
