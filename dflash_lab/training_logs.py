"""Metrics logs in the lab trainer's container, as a trainer writes them beside its
checkpoints: JSON lines, CSV, and (where tensorboardX is installed) a TensorBoard event
directory. TEST CONTENT: each value is a formula of the step (`logged_values`), so a test
knows what every step must show; nothing is trained for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflash_lab.lab import Lab

LOG_DIR = "/workspace/logs"  # inside the container
FIELDS = ["loss", "train_acc"]


def logged_values(step: int) -> dict[str, float]:
    """What the lab's trainer logs at `step`: a falling loss, a rising acceptance."""
    return {"loss": round(4.0 / (1 + step / 1000), 6), "train_acc": round(step / (step + 4000), 6)}


def write_training_logs(lab: Lab, steps: Iterable[int], every: int = 500) -> dict[str, dict]:
    """Logs every `every` steps up to the last of `steps` into the container; per format,
    the inventory's `metrics:` section that names its log."""
    last = max(steps)
    logged = range(every, last + 1, every)
    directory = lab.container_path(LOG_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [{"step": step, **logged_values(step), "lr": 1e-4} for step in logged]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    header = ["global_step", "lr", *FIELDS]
    rows = [[str(line["step"]), str(line["lr"]), *(str(line[f]) for f in FIELDS)] for line in lines]
    (directory / "metrics.csv").write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    sections = {
        "jsonl": {"path": f"{LOG_DIR}/metrics.jsonl", "format": "jsonl", "fields": FIELDS},
        "csv": {
            "path": f"{LOG_DIR}/metrics.csv",
            "format": "csv",
            "step_key": "global_step",
            "fields": FIELDS,
        },
    }
    try:
        import tensorboardX
    except ImportError:
        return sections
    writer = tensorboardX.SummaryWriter(str(directory / "tensorboard"))
    for step in logged:
        for field, value in logged_values(step).items():
            writer.add_scalar(field, value, step)
    writer.close()
    sections["tensorboard"] = {
        "path": f"{LOG_DIR}/tensorboard",
        "format": "tensorboard",
        "fields": FIELDS,
    }
    return sections
