"""`diagnose`: why is this drafter worse than another? Both on the same prompts and target
features (the eval pipeline and its cache), then a ranked list of findings
(findings.py), most likely cause first.

What is measured, for the candidate and the other drafter alike: τ and per-slot acceptance,
calibration per slot, τ by context length and by prompt set, per-module weight norms, and the
features' provenance and fidelity record. Then repairs: the candidate re-evaluated on the
same prompts, in the same τ convention as its own τ, with one setting changed at a time
(target layer ids: each ±1, all ±1, the default rule's, the other drafter's; block size: half,
double, the other's, all of its slots drafted and scored; mask token: the other drafter's and
the tokenizer's special tokens). Each repair is measured (repair_stats.py): Δτ with its paired
interval, the share of the gap it closes with Fieller's interval, and whether it survives
Holm's correction over all repairs tried and the minimum effect.

A candidate that does not load strictly is diagnosed from its parameters alone (the `fc`
width against the layer ids its config names): nothing else can be measured.

The output (written to --out) is one JSON object: `findings` (ranked) plus the data behind
them, for the workstation's summary and report.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.diagnose import findings, repair_runs, stats, walks
from dflash_eval.drafter.checkpoint import read_drafter
from dflash_eval.drafter.health import NonFiniteWeights
from dflash_eval.drafter.loaders import LoadedDrafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.torch_reader import TORCH_READER
from dflash_eval.run import evaluate, inputs, record
from dflash_eval.run.drafters import ddtree_budgets, load_for_run
from dflash_eval.run.options import EvalOptions
from dflash_eval.run.prepared import prepare
from dflash_eval.run.results import write_results
from dflash_eval.run.threads import host_cores
from dflash_eval.target.device import resolve_device
from dflash_eval.target.source import TargetSource
from dflash_eval.walk.metrics import summarize

DIAGNOSIS_FORMAT = 2  # 2: measured repairs replace scored probes


@dataclass
class DiagnoseOptions:
    run: EvalOptions  # checkpoint: the candidate; reference_drafter: the drafter it is held to
    against: str = "reference"  # how the workstation names the other drafter


def run_diagnose(options: DiagnoseOptions, progress: Progress) -> dict[str, Any]:
    run = options.run
    if run.reference_drafter is None:
        raise HarnessError("diagnose needs the drafter to compare with: pass --reference-drafter.")
    started = time.perf_counter()
    inputs.check_paths(run)
    prepared = prepare(run, host_cores(), resolve_device)
    torch.set_num_threads(prepared.threads)
    timer, warnings = Timer(), []
    target = TargetSource(run.target, run.target_dtype, timer, progress)
    try:
        candidate = load_for_run(run.checkpoint, run, target.shape, progress, warnings)
    except HarnessError as error:
        diagnosis = _unloadable(options, error, target.shape.hidden_size)
        write_results(run.out, diagnosis)
        return diagnosis
    other = load_for_run(run.reference_drafter, run, target.shape, progress, warnings, candidate)
    # The DDTree budgets as eval resolves them (its default; none for a DFlash-2 drafter).
    prepared = prepared.with_ddtree(ddtree_budgets(run.ddtree, [candidate, other]))
    run = prepared.options
    options = dataclasses.replace(options, run=run)
    drafters = {"drafter": candidate.config, "reference drafter": other.config}
    # Completions from the target itself (no feature set, no client): a diagnosis never asks
    # SGLang.
    parts = evaluate._target_side(prepared, None, target, None, drafters, warnings, progress, timer)
    head = target.embedding_and_head()
    sides = {}
    for role, loaded in (("candidate", candidate), ("other", other)):
        with timer.phase(f"diagnose_{role}"):
            walked = walks.walk(loaded, parts.sequences, head, run, progress, role)
        sides[role] = _side(loaded, walked, parts, run)
    sides["candidate"]["training_run"] = run.training_run
    base = stats.per_prompt_tau(sides["candidate"].pop("_walks"))
    theirs = stats.per_prompt_tau(sides["other"].pop("_walks"))
    with timer.phase("blind"):
        blind = [walks.blind_taus(loaded, parts, head, run) for loaded in (candidate, other)]
    for role, taus, without in (("candidate", base, blind[0]), ("other", theirs, blind[1])):
        sides[role]["feature_reliance"] = stats.paired_difference(taus, without)
    with timer.phase("repairs"):
        repairs = repair_runs.measure_repairs(
            run, candidate, other, parts, head, (base, theirs), progress
        )
    repairs["features"] = repair_runs.feature_share((base, theirs), blind, repairs["tried"])
    diagnosis = {
        "format": DIAGNOSIS_FORMAT,
        "against": options.against,
        "candidate": sides["candidate"],
        "other": sides["other"],
        "gap": stats.paired_difference(theirs, base),
        "prompts": record.prompts_block(parts),  # which pulled runs measured the same
        "features": parts.features,
        "repairs": repairs,
        "warnings": warnings,
        "timings": {**timer.seconds, "total": time.perf_counter() - started},
    }
    diagnosis["findings"] = findings.rank(diagnosis)
    write_results(run.out, diagnosis)
    return diagnosis


def _side(
    loaded: LoadedDrafter, walked: walks.Walked, parts: record.RunParts, run: EvalOptions
) -> dict[str, Any]:
    """Everything measured of one drafter (`_walks` is taken out once the gap is known)."""
    sequences = parts.sequences
    first_anchors = [seq.span.first_anchor for seq in sequences if seq.span is not None]
    return {
        "checkpoint": str(loaded.source.path),
        "step": loaded.source.step,
        "drafter": record.drafter_block(loaded),
        "metrics": summarize(walked.walks, loaded.config.block_size, run.ddtree),
        "calibration": stats.calibration(walked.walks, walked.slot_stats),
        "by_context_length": stats.by_context_length(
            walked.walks, first_anchors, run.max_new_tokens
        ),
        "by_prompt_set": stats.by_prompt_set(
            [seq.prompt.dataset or "prompts" for seq in sequences], walked.walks
        ),
        "weights": stats.module_norms(loaded.model),
        "_walks": walked.walks,
    }


def _unloadable(options: DiagnoseOptions, error: HarnessError, hidden_size: int) -> dict[str, Any]:
    """The diagnosis of a candidate that does not load: its parameters against its config."""
    run = options.run
    policy = PicklePolicy(tuple(run.safe_globals), run.allow_unsafe_pickle)
    source = read_drafter(run.checkpoint, TORCH_READER, policy)
    diagnosis: dict[str, Any] = {
        "format": DIAGNOSIS_FORMAT,
        "against": options.against,
        "candidate": {
            "checkpoint": str(run.checkpoint),
            "step": source.step,
            "load_error": str(error),
            "load_error_kind": "non-finite" if isinstance(error, NonFiniteWeights) else "strict",
            "config": source.config_dict,
            "shapes": {name: list(t.shape) for name, t in source.state_dict.items()},
        },
        "hidden_size": hidden_size,
    }
    diagnosis["findings"] = findings.rank(diagnosis)
    return diagnosis
