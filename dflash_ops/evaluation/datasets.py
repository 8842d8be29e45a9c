"""Named prompt sets (`fab run-eval --dataset gsm8k,humaneval,mt-bench`), built on the
workstation as z-lab's DFlash benchmark (`dflash/benchmark.py`) builds them, and written as
the prompts JSONL that the run uploads: eval hosts never need the internet.

Per set, as that benchmark has it: the Hugging Face dataset, config and split; the field
read and the instruction wrapped around it; MT-Bench's two turns asked one after the other
(the harness puts the target's reply to the first before the second: its conversation.py).
The chat template and `enable_thinking` are applied on the eval host, where the tokenizer is.

Sampling: with --num-prompts N below the set's size, the rows are shuffled with
`random.Random(SEED)` and the first N kept, which picks the rows z-lab's transformers backend
picks for `--max-samples N` (it seeds Python's `random` with 0 and shuffles the rows in
dataset order); otherwise every row, in dataset order. Each JSONL record carries its set and
where the set came from (repository, resolved revision, split, seed, the selected rows'
sha256), and the harness records that in the results.

Loading and caching are in dflash_ops.evaluation.dataset_cache.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_ops.core.errors import DatasetError
from dflash_ops.core.files import write_atomic

SEED = 0  # z-lab's transformers backend: random.seed(0) before it shuffles
STEP_BY_STEP = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class DatasetSpec:
    """Where a set comes from and how a row becomes the user turns of one prompt."""

    name: str
    repo: str
    config: str | None
    split: str
    turns: Callable[[dict[str, Any]], list[str]]
    fields: tuple[str, ...]  # the row fields `turns` reads (checked before formatting)


HUMANEVAL_ASK = (
    "Write a solution to the following problem and make sure that it passes the tests:\n"
    "```python\n{}\n```"
)

REGISTRY: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "gsm8k", "openai/gsm8k", "main", "test",
            lambda row: [row["question"] + STEP_BY_STEP], ("question",),
        ),
        DatasetSpec(
            "math500", "HuggingFaceH4/MATH-500", None, "test",
            lambda row: [row["problem"] + STEP_BY_STEP], ("problem",),
        ),
        DatasetSpec(
            "humaneval", "openai/openai_humaneval", None, "test",
            lambda row: [HUMANEVAL_ASK.format(row["prompt"])], ("prompt",),
        ),
        DatasetSpec(
            "mbpp", "google-research-datasets/mbpp", "sanitized", "test",
            lambda row: [row["prompt"]], ("prompt",),
        ),
        DatasetSpec(
            "mt-bench", "HuggingFaceH4/mt_bench_prompts", None, "train",
            lambda row: list(row["prompt"]), ("prompt",),  # its turns, asked in order
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class SetRequest:
    """One entry of --dataset: a registered set, from the hub or from local data files."""

    spec: DatasetSpec
    files: tuple[Path, ...] = ()  # `name=PATH[;PATH…]`: read these instead of the hub


@dataclass
class LoadedSet:
    """Every row of a set, formatted, with where it came from."""

    spec: DatasetSpec
    rows: list[dict[str, Any]]  # {"row": index in the split, "turns": [...], "sha256": ...}
    origin: dict[str, Any]  # repo/config/split/revision, or files and their sha256


def parse_sets(text: str) -> list[SetRequest]:
    """`gsm8k,humaneval=/data/he.parquet` → the requests, refusing unknown names."""
    requests = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, files = part.partition("=")
        spec = REGISTRY.get(name.strip())
        if spec is None:
            raise DatasetError(
                f"--dataset: unknown prompt set {name.strip()!r}; known sets: "
                f"{', '.join(REGISTRY)} (add `=PATH` to read a known set from local files)"
            )
        paths = tuple(Path(f).expanduser() for f in files.split(";") if f.strip())
        for path in paths:
            if not path.is_file():
                raise DatasetError(
                    f"--dataset {spec.name}: {path} is not a file on this workstation"
                )
        requests.append(SetRequest(spec, paths))
    if not requests:
        raise DatasetError(f"--dataset names no prompt set; known sets: {', '.join(REGISTRY)}")
    return requests


def format_row(spec: DatasetSpec, index: int, row: dict[str, Any]) -> dict[str, Any]:
    """A row of the split as the user turns z-lab's benchmark asks, plus its own hash."""
    missing = [field for field in spec.fields if field not in row]
    if missing:
        raise DatasetError(
            f"{spec.name}: row {index} has no field {', '.join(missing)} (it has "
            f"{', '.join(sorted(row))}); the set is not shaped like {spec.repo}"
        )
    turns = spec.turns(row)
    if not turns or not all(isinstance(turn, str) for turn in turns):
        raise DatasetError(f"{spec.name}: row {index} does not give text turns: {turns!r:.200}")
    return {"row": index, "turns": turns, "sha256": row_sha256(row)}


def row_sha256(row: dict[str, Any]) -> str:
    canonical = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def select(rows: list[dict[str, Any]], count: int | None, seed: int = SEED) -> list[dict]:
    """`count` rows as z-lab samples them (module docstring); all of them when count is None
    or not below the set's size."""
    if count is not None and count < 1:
        raise DatasetError(f"--num-prompts must be at least 1 with --dataset, got {count}")
    if count is None or count >= len(rows):
        return list(rows)
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    return shuffled[:count]


def prompt_records(loaded: LoadedSet, count: int | None) -> list[dict[str, Any]]:
    """The prompts JSONL records of one set: the selected rows with the set's source."""
    chosen = select(loaded.rows, count)
    selected_sha256 = hashlib.sha256("\n".join(r["sha256"] for r in chosen).encode()).hexdigest()
    source = {
        **loaded.origin,
        "rows": len(loaded.rows),
        "selected": len(chosen),
        "sampled": len(chosen) < len(loaded.rows),  # else every row, in dataset order
        "seed": SEED,
        "selected_rows_sha256": selected_sha256,
        "format": "z-lab/dflash dflash/benchmark.py",
    }
    records = []
    for row in chosen:
        record: dict[str, Any] = {"id": f"{loaded.spec.name}-{row['row']}"}
        record.update({"dataset": loaded.spec.name, "source": source})
        if len(row["turns"]) > 1:
            record["turns"] = row["turns"]
        else:
            record["prompt"] = row["turns"][0]
        records.append(record)
    return records


def write_prompts(records: list[dict[str, Any]], directory: Path) -> Path:
    """Write the records as `prompts-<sha256 prefix>.jsonl` in `directory` (content-named:
    the same sets and sizes give the same file) and return its path."""
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
    digest = hashlib.sha256(text.encode()).hexdigest()
    path = directory / f"prompts-{digest[:16]}.jsonl"
    if not path.exists():
        write_atomic(path, text)
    return path
