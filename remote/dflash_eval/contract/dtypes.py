"""Dtype names as people type them (`bf16`, `fp32`, `torch.float16`) → the names the harness
takes and records (`bfloat16`, `float32`, `float16`). Stdlib only: the workstation checks
its flags with the same function before anything is staged.
"""

from __future__ import annotations

ALIASES = {
    "bf16": "bfloat16",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}


def dtype_name(text: str) -> str:
    """The canonical name of a dtype as typed; names it does not know come back as given
    (lower-cased), for the caller's check of allowed names to refuse."""
    name = str(text).strip().lower().removeprefix("torch.")
    return ALIASES.get(name, name)
