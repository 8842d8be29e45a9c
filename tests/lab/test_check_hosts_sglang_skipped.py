"""`fab check-hosts` asks an SGLang server from the host's venv: before `fab setup-eval-host`
has made it, the row says so and what to run (lab tier: real sshd, no venv)."""

from __future__ import annotations

import yaml

from dflash_ops.core.inventory import load
from dflash_ops.evaluation.served import CHECK, sglang_rows
from dflash_ops.remote import checks
from dflash_ops.remote.checks import Status


def test_a_host_without_its_venv_is_not_asked_yet(lab, tmp_path):
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["hosts"]["eval"]["sglang_url"] = "http://u:s3cret@127.0.0.1:9"
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    rows = checks.check_inventory(load(path), more=[sglang_rows])
    [row] = [row for row in rows if row.check == CHECK]
    assert (row.host, row.status) == ("eval", Status.SKIPPED)
    assert row.detail.startswith("http://127.0.0.1:9/*** not asked: the venv at ")
    assert row.detail.endswith("run `fab setup-eval-host --host eval`, then check again")
    assert not checks.failed(rows)  # skipped: check-hosts still passes
