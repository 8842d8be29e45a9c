"""What the lab's hosts hold: drafter checkpoints in the trainer's container, and on each
eval host (and the features host) a target model (and a reference drafter).

A content generator fills a freshly built lab and returns, per host that holds a target, the
inventory settings that point at what it made there (target_model, reference_drafter).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_lab.state import LAB_PROMPTS, LabConfig
from dflash_ops.core.errors import LabError
from dflash_ops.core.units import parse_size

if TYPE_CHECKING:
    from dflash_lab.lab import Lab
    from dflash_lab.models import LabModels

# The tiny models take minutes to train: built once per machine, then copied from here.
MODEL_CACHE = Path(os.environ.get("DFLASH_LAB_CACHE", Path.home() / ".cache" / "dflash-lab"))

ContentGenerator = Callable[["Lab", LabConfig], dict[str, dict]]


def random_checkpoints(lab: Lab, config: LabConfig) -> dict[str, dict]:
    """Default content: checkpoint files of random bytes at each step, and an empty
    directory where each eval host's target model would be."""
    size = parse_size(config.checkpoint_size)
    for step in config.steps:
        path = lab.checkpoint_path(step)
        path.parent.mkdir(parents=True)
        with path.open("wb") as out:
            remaining = size
            while remaining:
                chunk = os.urandom(min(remaining, 1 << 20))
                out.write(chunk)
                remaining -= len(chunk)
    settings = {}
    for name in config.target_hosts:
        target = lab.data_dir(name) / "models" / "tiny-target"
        target.mkdir(parents=True)
        settings[name] = {"target_model": str(target)}
    return settings


def trained_models(lab: Lab, config: LabConfig) -> dict[str, dict]:
    """A tiny target model on each eval host, and drafter checkpoints trained on it at each
    step in the trainer's container (built once, then reused from a cache)."""
    from dflash_lab.models import build_lab_models

    return _place(lab, config, build_lab_models(MODEL_CACHE, steps=config.steps), "tiny-target")


def qwen36_models(lab: Lab, config: LabConfig) -> dict[str, dict]:
    """As `trained_models`, on the miniature Qwen3.6 target (dflash_lab/qwen36.py), with its
    sliding-window reference drafter."""
    from dflash_lab.qwen36 import build_qwen36_models

    models = build_qwen36_models(MODEL_CACHE, steps=config.steps)
    return _place(lab, config, models, "qwen3.6-mini")


def _place(lab: Lab, config: LabConfig, models: LabModels, target_name: str) -> dict[str, dict]:
    """Copy the checkpoints into the trainer's container, the target and the reference
    drafter onto each host that holds a target, the prompts into the lab."""
    for step in config.steps:
        path = lab.checkpoint_path(step)
        path.parent.mkdir(parents=True)
        shutil.copyfile(models.checkpoints[step], path)
    reference = models.reference_dir or reference_drafter(models.checkpoints[max(config.steps)])
    settings = {}
    for name in config.target_hosts:
        # copytree keeps the files' mtimes: the target's fingerprint is the same on every host
        target = lab.data_dir(name) / "models" / target_name
        shutil.copytree(models.target_dir, target)
        shutil.copytree(reference, target.with_name("reference-drafter"))
        settings[name] = {
            "target_model": str(target),
            "reference_drafter": str(target.with_name("reference-drafter")),
        }
    if models.prompts is not None:  # prompts the tiny target answers sensibly
        shutil.copyfile(models.prompts, lab.root / LAB_PROMPTS)
    return settings


CONTENTS: dict[str, ContentGenerator] = {
    "random": random_checkpoints,
    "models": trained_models,
    "qwen3.6": qwen36_models,
}


def content_generator(kind: str) -> ContentGenerator:
    """The generator named on the command line (a key of CONTENTS)."""
    if kind not in CONTENTS:
        raise LabError(
            f"unknown lab content {kind!r}; expected one of {', '.join(map(repr, CONTENTS))}"
        )
    return CONTENTS[kind]


def reference_drafter(checkpoint: Path) -> Path:
    """A 'published' drafter to compare against: the last checkpoint without its optimizer
    state (the harness's extracted form), made once next to the cached checkpoint. Workers
    building labs at once each extract into a directory of their own; the first to rename
    it into place wins and the others drop theirs (a shared `.tmp` raced: one rename found
    the other's files in it)."""
    from dflash_eval.run.extract import extract

    out = checkpoint.parent / "reference-drafter"
    if (out / "model.safetensors").exists():
        return out
    partial = Path(tempfile.mkdtemp(prefix="reference-drafter.", dir=checkpoint.parent))
    try:
        extract(checkpoint, partial / "drafter")
        (partial / "drafter").rename(out)
    except OSError:
        if not (out / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out
