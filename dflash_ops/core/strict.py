"""The base of every inventory section: strict types, unknown keys refused, immutable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # No infinite or NaN number: a value the tool would sleep, size or count by.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
