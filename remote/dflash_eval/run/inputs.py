"""A run's inputs, checked before anything heavy loads: paths that must exist, directories
that must be writable, drafter options that must parse."""

from __future__ import annotations

import tempfile
from pathlib import Path

from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.pickle_policy import expand_names
from dflash_eval.drafter.profile import read_profile
from dflash_eval.drafter.provenance import accepted_defaults
from dflash_eval.run.options import EvalOptions


def check_paths(options: EvalOptions) -> None:
    """Fail in a second, not after loading a large target, when an input is missing."""
    inputs = [("--checkpoint", options.checkpoint), ("--target", options.target)]
    inputs += [("--reference-drafter", options.reference_drafter)] * bool(options.reference_drafter)
    inputs += [("--prompts", options.prompts)] * bool(options.prompts)
    inputs += [("--drafter-config", options.drafter_config)] * bool(options.drafter_config)
    inputs += [("--drafter-profile", options.drafter_profile)] * bool(options.drafter_profile)
    for flag, path in inputs:
        if not Path(path).exists():
            raise HarnessError(
                f"{flag} {path} does not exist on this host. Check the path; checkpoints "
                "must be staged to the eval host before they can be evaluated."
            )
    # Malformed drafter options fail now too (they are read again when loading).
    if options.drafter_profile:
        read_profile(options.drafter_profile)
    accepted_defaults(options.accept_default, ())
    expand_names(options.safe_globals)
    outputs = [("--out", Path(options.out).parent)]
    outputs += [("--cache-dir", options.cache_dir)] * bool(options.cache_dir)
    for flag, directory in outputs:
        require_writable(flag, directory)


def require_writable(label: str, directory: Path) -> None:
    """Create `directory` if needed and write a scratch file in it, so that a run whose
    output cannot land fails now, not after hours of work. `label` names the flag (and
    value) in the message."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as error:
        raise HarnessError(
            f"{label}: cannot write in {directory} ({error.strerror}). Choose a writable "
            "directory (and check free space) before a long run, not after it."
        ) from None
