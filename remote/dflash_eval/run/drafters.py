"""A run's drafters: the drafter and the reference drafter, loaded for one run, and the DDTree
budgets the pair allows. Shared by `eval` and `diagnose`, which load the same two alike.
"""

from __future__ import annotations

from pathlib import Path

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.contract.summary import settings_line
from dflash_eval.drafter.loaders import LoadedDrafter, load_drafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.profile import read_profile
from dflash_eval.run import record
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.config import TargetShape

DEFAULT_DDTREE = [4, 8, 16, 32]


def ddtree_budgets(asked: list[int] | None, loaded: list[LoadedDrafter | None]) -> list[int]:
    """The budgets to evaluate: as asked, else the default; none when a drafter is DFlash-2
    (DDTree is defined over per-slot distributions that a DFlash-2 drafter does not have:
    docs/dflash2.md), and asking for some then is refused."""
    dflash2 = [str(d.source.path) for d in loaded if d is not None and d.config.dflash2]
    if not dflash2:
        return DEFAULT_DDTREE if asked is None else asked
    if asked:
        raise HarnessError(
            f"--ddtree {','.join(map(str, asked))}: {dflash2[0]} is a DFlash-2 drafter, whose "
            "drafts come from a sequential candidate selector, and DDTree is not defined over "
            "it (docs/dflash2.md); leave --ddtree out or pass --ddtree ''."
        )
    return []


def load_for_run(
    path: Path,
    options: EvalOptions,
    target_shape: TargetShape,
    progress: Progress,
    warnings: list[str],
    drafter: LoadedDrafter | None = None,
) -> LoadedDrafter:
    """Load the drafter, or (given the drafter) the reference drafter: flags that describe
    one checkpoint apply to the drafter only; the reference runs in the drafter's dtype."""
    main = drafter is None
    role = "drafter" if main else "reference drafter"
    progress.status(f"Loading {role} {path} …")
    loaded = load_drafter(
        path,
        target_shape,
        config_file=options.drafter_config if main else None,
        profile=read_profile(options.drafter_profile) if main and options.drafter_profile else None,
        block_size=options.block_size if main else None,
        mask_token_id=options.mask_token_id if main else None,
        target_layer_ids=options.target_layer_ids if main else None,
        dtype=options.dtype if drafter is None else drafter.dtype_offer(),
        accept_default=options.accept_default,
        pickle_policy=PicklePolicy(tuple(options.safe_globals), options.allow_unsafe_pickle),
    )
    source = loaded.source
    progress.say(
        f"  {role}: {source.kind}, config from {loaded.config_source}, step {source.step}"
        f" ({source.step_source})"
    )
    progress.say(f"  {role}: {settings_line(record.drafter_block(loaded))}")
    for note in loaded.notes:
        progress.say(f"  {role}: {note}")
    if loaded.ignored_parameters:
        progress.say(f"  {role}: set aside target copies {loaded.ignored_parameters}")
    for warning in loaded.warnings:
        warnings.append(f"{role}: {warning}")
        progress.warn(warnings[-1])
    return loaded


def load_drafters(
    options: EvalOptions, target_shape: TargetShape, progress: Progress, warnings: list[str]
) -> tuple[LoadedDrafter, LoadedDrafter | None]:
    """The run's drafter and, when --reference-drafter names one, its reference drafter."""
    drafter = load_for_run(options.checkpoint, options, target_shape, progress, warnings)
    if not options.reference_drafter:
        return drafter, None
    reference = options.reference_drafter
    return drafter, load_for_run(reference, options, target_shape, progress, warnings, drafter)
