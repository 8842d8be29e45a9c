"""Pulled runs with training metrics, and W&B's offline run files read back: shared by the
training-metrics and W&B tests (unit, lab and e2e)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from dflash_ops.evaluation.training_metrics import TRAINING_FILE
from tests.schema_samples import results_dict

LOGGED = {2000: {"loss": 2.5, "acc": 0.25}, 4000: {"loss": 1.75, "acc": "nan"}}


def pull(root: Path, step: int, tau: float, training: dict | None) -> None:
    """A pulled run of `step` with τ macro `tau`, and its training.json when `training`."""
    outcome = results_dict()
    outcome["checkpoint"]["step"] = step
    outcome["metrics"]["tau_macro"] = tau
    directory = root / f"20261201-1200{step // 1000:02d}-step{step}-eval-ab{step // 1000:02d}"
    directory.mkdir(parents=True)
    run = {"run_id": directory.name, "host": "eval", "state": "succeeded", "step": step}
    (directory / "run.json").write_text(json.dumps({**run, "started": step}))
    (directory / "results.json").write_text(json.dumps(outcome))
    if training is not None:
        record = {
            "step": step,
            "log": {"path": "/w/m.jsonl", "format": "jsonl"},
            "values": training,
        }
        (directory / TRAINING_FILE).write_text(json.dumps(record))


BLOCK = 32768  # the transaction log's block size
HEADER = 7  # ':W&B', magic, version; then each chunk: crc32 (4), length (2), type (1)
FULL, LAST = 1, 4


def logged_records(path: Path) -> list:
    """Every record of an offline run's transaction log, in order (wandb's own protobuf
    classes read them; wandb must be installed)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if left < HEADER or (length, kind) == (0, 0):  # the block's zero padding
            pos += left
            continue
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def offline_runs(directory: Path) -> list[tuple[object, dict[str, object]]]:
    """(run record, logged history) of each offline run under `directory`, oldest first."""
    found = []
    for path in sorted(directory.glob("wandb/offline-run-*/run-*.wandb")):
        records = logged_records(path)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        history = {}
        for record in records:
            if record.WhichOneof("record_type") == "history":
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    history[key] = json.loads(item.value_json)
        found.append((run, history))
    return found
