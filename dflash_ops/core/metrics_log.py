"""A training run's `metrics:` section of the inventory: the log its trainer writes (loss,
train-time acceptance, …), read at the steps evaluated so they sit beside τ.

    runs:
      v5:
        metrics: {path: /workspace/v5/metrics.jsonl, format: jsonl, step_key: step,
                  fields: [loss, train_acc]}

`path` is inside the training environment, as `checkpoints` is. `jsonl`: one JSON object a
line; `csv`: a header row, then one row per logged step; `tensorboard`: an event file, or a
directory whose `events.out.tfevents.*` files are read in name order (each event carries its
step, so no `step_key`). How the file is read: dflash_ops.evaluation.training_metrics.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from dflash_ops.core.strict import Strict

DEFAULT_STEP_KEY = "step"
MAX_FIELDS = 32


def _unique(names: list[str]) -> list[str]:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"each field once; repeated: {', '.join(repeated)}")
    return names


FieldName = Annotated[str, Field(min_length=1, max_length=128)]


class MetricsLog(Strict):
    """Where a training run logs its metrics, and which of them to show beside τ."""

    path: str = Field(min_length=1)
    format: Literal["jsonl", "csv", "tensorboard"]
    step_key: FieldName | None = None  # jsonl/csv: the key holding the step (default "step")
    fields: Annotated[
        list[FieldName], Field(min_length=1, max_length=MAX_FIELDS), AfterValidator(_unique)
    ]

    @model_validator(mode="after")
    def _events_carry_their_step(self) -> MetricsLog:
        if self.format == "tensorboard" and self.step_key is not None:
            raise ValueError("step_key: not for tensorboard (each event carries its step)")
        return self

    @property
    def step_name(self) -> str:
        """The key (jsonl) or column (csv) that holds the step."""
        return self.step_key or DEFAULT_STEP_KEY
