"""The inventory's `metrics:` section (core/metrics_log.py): a training run names its metrics
log, a run without one inherits the trainer's, and a section that cannot be read is one line
naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dflash_ops.core import inventory
from dflash_ops.core.errors import InventoryError
from tests.inventory_documents import minimal_document

LOG = {"path": "/workspace/v5/metrics.jsonl", "format": "jsonl", "fields": ["loss", "acc"]}


def load(tmp_path: Path, document: dict) -> inventory.Inventory:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(document))
    return inventory.load(path)


def test_each_run_reads_its_own_log_and_inherits_the_trainers(tmp_path):
    own = {**LOG, "path": "/workspace/metrics.csv", "format": "csv", "step_key": "global_step"}
    runs = {"v5": {"checkpoints": "/v5", "metrics": LOG}, "v6": {"checkpoints": "/v6"}}
    inv = load(tmp_path, minimal_document(metrics=own, runs=runs))
    v5 = inv.for_run("v5").trainer.metrics
    assert (v5.path, v5.format, v5.step_name, v5.fields) == (
        LOG["path"],
        "jsonl",
        "step",
        LOG["fields"],
    )
    assert inv.for_run("v6").trainer.metrics.path == "/workspace/metrics.csv"
    assert inv.for_run(None).trainer.metrics.step_name == "global_step"
    assert load(tmp_path, minimal_document()).trainer.metrics is None


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({**LOG, "format": "wandb"}, r"runs\.v5\.metrics\.format"),
        ({**LOG, "fields": []}, r"runs\.v5\.metrics\.fields"),
        ({**LOG, "fields": ["loss", "loss"]}, r"each field once; repeated: loss"),
        ({**LOG, "format": "tensorboard", "step_key": "step"}, r"step_key: not for tensorboard"),
        ({**LOG, "colour": "red"}, r"runs\.v5\.metrics\.colour"),
        ({"path": "/m", "format": "csv"}, r"runs\.v5\.metrics\.fields"),
    ],
)
def test_a_metrics_section_that_cannot_be_read_is_one_line_naming_it(tmp_path, metrics, message):
    document = minimal_document(runs={"v5": {"metrics": metrics}})
    with pytest.raises(InventoryError, match=message) as raised:
        load(tmp_path, document)
    assert "\n" not in str(raised.value) and "inv.yaml" in str(raised.value)
