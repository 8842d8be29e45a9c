"""Mutation check (`make mutation`): which behaviour of the modules where a silent bug would
change numbers or lose data does no test pin down?

One small AST change at a time — a flipped comparison, ±1 on an integer, `and`/`or`
swapped, `not` dropped, `+`/`-` swapped, True/False swapped, a statement dropped, a return
value replaced by None — is applied to a copy of the tree in a temporary directory, and the
module's own fast tests run against it (`pytest -x -q`, in a forked child of a process that
has already imported torch & co., under a timeout). A mutant the tests do not notice
*survives*. The score is killed / (mutants − equivalent ones); equivalent mutants (no input
can tell them apart) are listed once, with the reason, in mutation-equivalents.yaml.

Not mutated: strings, annotations, docstrings, and expressions inside f-strings (they only
shape messages). A module may be restricted to some functions/classes (`scopes`). When a
module has more mutants than `--max-mutants`, a fixed-seed sample of that many is run.

    python scripts/mutation.py [--module NAME ...] [--max-mutants N] [--seed S] [--list]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from mutants import Mutant, Target, mutants_of, mutated_source

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = Path(__file__).with_name("mutation-equivalents.yaml")
# Imported once here so that each forked test run starts with them loaded.
PRELOAD = ("pytest", "torch", "safetensors.torch", "transformers", "yaml", "pydantic", "fabric")

HARNESS = "tests/unit/harness"
# Harness tests that run whole evaluations on the lab models: not the modules' fast tests.
SLOW_HARNESS = (
    "--deselect",
    f"{HARNESS}/test_provenance.py::test_results_record_provenance_and_clean_loads_have_no_warnings",
    "--deselect",
    f"{HARNESS}/test_provenance.py::test_command_line_flags_reach_the_loader_and_the_summary",
    "--deselect",
    f"{HARNESS}/test_provenance.py::test_the_reference_drafter_runs_in_the_drafters_dtype",
    "--deselect",
    f"{HARNESS}/test_pickle_policy.py::test_results_record_the_pickle_policy",
    "--deselect",
    f"{HARNESS}/test_cache.py::test_changed_run_inputs_miss_and_unchanged_ones_hit",
)
LOADER_TESTS = (
    f"{HARNESS}/test_loaders.py",
    f"{HARNESS}/test_loader_formats.py",
    f"{HARNESS}/test_loader_profiles.py",
    f"{HARNESS}/test_pickle_policy.py",
    f"{HARNESS}/test_provenance.py",
)
RUNS_UNIT_TESTS = (
    "test_a_run_inherits_what_it_leaves_out_from_the_trainer",
    "test_without_run_the_trainer_s_own_checkpoints_keep_today_s_paths",
    "test_a_run_name_must_be_one_safe_path_component",
    "test_a_run_s_keys_are_checked_like_the_trainer_s",
    "test_checkpoints_are_needed_of_the_trainer_or_of_every_run",
    "test_several_runs_and_no_own_checkpoints_need_run",
    "test_an_unknown_run_is_refused_with_the_runs_listed",
    "test_the_chosen_run_is_not_a_key_of_the_file",
)
BECOME_UNIT_TESTS = (
    "test_become_is_sudo_or_nothing",
    "test_only_a_become_host_wraps_its_commands_in_sudo_and_keeps_them_whole",
    "test_the_root_hint_speaks_only_to_a_non_root_login_without_become",
)
BWLIMIT_UNIT_TESTS = (
    "test_the_inventory_reads_transfer_bwlimit_as_bytes_per_second",
    "test_a_bad_transfer_bwlimit_names_the_key_and_the_expected_units",
    "test_the_bwlimit_flag_overrides_the_inventory_and_none_lifts_it",
)
# The inventory's tests, for both of its modules (the schema and its error explanations).
INVENTORY_TESTS = (
    "tests/unit/test_inventory_structure.py",
    "tests/unit/test_inventory.py",
    # The unit tests of the inventory's newer sections (runs, become, bwlimit, the features
    # host); their files' other tests build labs.
    *(f"tests/lab/test_runs.py::{name}" for name in RUNS_UNIT_TESTS),
    *(f"tests/lab/test_become.py::{name}" for name in BECOME_UNIT_TESTS),
    *(f"tests/lab/test_gentle_transfer.py::{name}" for name in BWLIMIT_UNIT_TESTS),
    "tests/unit/test_feature_spec.py",
    # The same check through the real `fab` process: slow, and not the module's own.
    "--deselect",
    "tests/unit/test_inventory.py::test_typo_via_fab_is_one_clear_line",
)
TARGETS = (
    Target("metrics", "remote/dflash_eval/walk/metrics.py", (f"{HARNESS}/test_metrics.py",)),
    Target("t interval", "remote/dflash_eval/contract/student.py", (f"{HARNESS}/test_student.py",)),
    Target(
        "repair stats",
        "remote/dflash_eval/diagnose/repair_stats.py",
        (f"{HARNESS}/test_repair_stats.py",),
    ),
    Target(
        "cache",
        "remote/dflash_eval/reference/cache.py",
        (f"{HARNESS}/test_cache_keys.py", f"{HARNESS}/test_cache.py", *SLOW_HARNESS),
    ),
    Target(
        "checkpoint", "remote/dflash_eval/drafter/checkpoint.py", (*LOADER_TESTS, *SLOW_HARNESS)
    ),
    Target("loaders", "remote/dflash_eval/drafter/loaders.py", (*LOADER_TESTS, *SLOW_HARNESS)),
    Target(
        "config",
        "remote/dflash_eval/drafter/config.py",
        (
            f"{HARNESS}/test_drafter_config.py",
            f"{HARNESS}/test_rope.py",
            *LOADER_TESTS,
            *SLOW_HARNESS,
        ),
    ),
    Target(
        "config fit",
        "remote/dflash_eval/drafter/fit.py",
        (f"{HARNESS}/test_drafter_config.py", *LOADER_TESTS),
    ),
    Target(
        "served agreement",
        "dflash_ops/evaluation/served_agreement.py",
        ("tests/unit/test_served_paired.py", "tests/unit/test_served_records.py"),
    ),
    Target("inventory", "dflash_ops/core/inventory.py", INVENTORY_TESTS),
    Target("inventory errors", "dflash_ops/core/inventory_errors.py", INVENTORY_TESTS),
    Target(
        "relay hashing",
        "dflash_ops/staging/relay_commands.py",
        ("tests/unit/test_relay_hashing.py",),
        scopes=(
            "_py",
            "_by_hasher",
            "hash_stdin",
            "hash_file",
            "stream_hashed",
            "source_command",
            "sink",
            "digest_in",
            "stderr_reason",
        ),
    ),
    Target(
        "relay stream",
        "dflash_ops/staging/relay.py",
        ("tests/unit/test_relay_hashing.py",),
        scopes=("Moved", "move"),
    ),
    Target(
        "staging manifest",
        "dflash_ops/staging/manifest.py",
        ("tests/unit/test_staging_manifest_matching.py", "tests/unit/test_staging_manifest.py"),
    ),
)


# --- running the tests ------------------------------------------------------------------


def copy_tree(destination: Path) -> Path:
    """The repository's files (tracked and new, not ignored) copied without bytecode."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def module_name(path: str) -> str:
    """remote/dflash_eval/walk/metrics.py → dflash_eval.walk.metrics (pytest puts remote/ on
    the path)."""
    return path.removeprefix("remote/").removesuffix(".py").replace("/", ".")


def run_tests(
    tree: Path, tests: tuple[str, ...], timeout: int, log: Path, module: str | None = None
) -> str:
    """'passed', 'failed' or 'timeout': pytest in a forked child, output in `log`. With
    `module`, also 'not-imported' unless the tests imported it from `tree`."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setpgid(0, 0)
            signal.alarm(timeout)  # the default action ends the child: a hung mutant
            os.chdir(tree)
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            import pytest

            args = [*tests, "-x", "-q", "-p", "no:cacheprovider", "--rootdir", str(tree)]
            code = int(pytest.main(args))
            loaded = sys.modules.get(module) if module else None
            if module and not (loaded and str(loaded.__file__).startswith(f"{tree}/")):
                code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # anything the tests started and left behind
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        return "timeout"
    if module and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 4:
        return "not-imported"
    return "passed" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "failed"


@dataclass
class Score:
    target: Target
    generated: int = 0
    equivalent: int = 0
    tested: int = 0
    killed: int = 0
    timeouts: int = 0
    survivors: list[Mutant] = field(default_factory=list)

    @property
    def percent(self) -> float | None:
        return 100.0 * self.killed / self.tested if self.tested else None


def check_target(
    target: Target, equivalents: dict[str, str], max_mutants: int, seed: int, work: Path
) -> Score:
    source = (ROOT / target.path).read_text()
    mutants = mutants_of(target, source)
    score = Score(target, generated=len(mutants))
    candidates = [m for m in mutants if m.id not in equivalents]
    score.equivalent = len(mutants) - len(candidates)
    if len(candidates) > max_mutants:
        candidates = sorted(random.Random(seed).sample(candidates, max_mutants), key=_order)
    tree = copy_tree(work / target.name.replace(" ", "-"))
    module = tree / target.path
    log = work / f"{target.name.replace(' ', '-')}.log"
    module.write_text(ast.unparse(ast.parse(source)) + "\n")  # the same printer as mutants
    started = time.monotonic()
    baseline = run_tests(tree, target.tests, 600, log, module_name(target.path))
    if baseline == "not-imported":
        raise SystemExit(f"{target.name}: the tests did not import {target.path} from the copy")
    if baseline != "passed":
        raise SystemExit(f"{target.name}: its tests fail without any mutant:\n{log.read_text()}")
    timeout = max(30, int(10 * (time.monotonic() - started)))
    for number, mutant in enumerate(candidates, 1):
        module.write_text(mutated_source(mutant, source))
        outcome = run_tests(tree, target.tests, timeout, log)
        score.tested += 1
        score.killed += outcome != "passed"
        score.timeouts += outcome == "timeout"
        if outcome == "passed":
            score.survivors.append(mutant)
        if sys.stdout.isatty():
            print(f"\r  {target.name}: {number}/{len(candidates)}", end="", flush=True)
    print(f"\r  {target.name}: {score.tested} mutants run, {score.killed} killed", flush=True)
    return score


def _order(mutant: Mutant) -> int:
    return mutant.index


# --- reporting --------------------------------------------------------------------------


def load_equivalents() -> dict[str, str]:
    entries = yaml.safe_load(EQUIVALENTS.read_text()) or []
    return {entry["id"]: entry["why"] for entry in entries}


def report(scores: list[Score], stale: list[str]) -> None:
    print("\nSurviving mutants (no test noticed the change):")
    for score in scores:
        for mutant in score.survivors:
            print(f"  {mutant.target.path}:{mutant.line}  {_short(mutant.id.split('::', 1)[1])}")
    for entry in stale:
        print(f"  (listed as equivalent but no longer generated: {_short(entry)})")
    print(f"\n{'module':<22}{'mutants':>8}{'equiv':>7}{'run':>6}{'killed':>8}{'score':>8}")
    for s in scores:
        percent = f"{s.percent:.0f} %" if s.percent is not None else "-"
        print(
            f"{s.target.name:<22}{s.generated:>8}{s.equivalent:>7}{s.tested:>6}"
            f"{s.killed:>8}{percent:>8}"
        )


def _short(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", help="only these (by name); repeatable")
    parser.add_argument("--max-mutants", type=int, default=150, help="per module (sampled)")
    parser.add_argument("--seed", type=int, default=16, help="for the sample")
    parser.add_argument("--fail-under", type=float, default=0, help="exit 1 below this score")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    args = parser.parse_args(argv)
    chosen = [t for t in TARGETS if not args.module or t.name in args.module]
    if not chosen:
        parser.error(f"no such module; choose from {', '.join(t.name for t in TARGETS)}")
    equivalents = load_equivalents()
    if args.list:
        for target in chosen:
            for mutant in mutants_of(target, (ROOT / target.path).read_text()):
                mark = "  (equivalent)" if mutant.id in equivalents else ""
                print(f"{mutant.line:>5}  {mutant.id}{mark}")
        return 0
    sys.dont_write_bytecode = True  # a mutant must never be shadowed by a cached .pyc
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    scores = []
    with tempfile.TemporaryDirectory(prefix="dflash-mutation-") as work:
        for target in chosen:
            scores.append(
                check_target(target, equivalents, args.max_mutants, args.seed, Path(work))
            )
    generated = {m.id for t in chosen for m in mutants_of(t, (ROOT / t.path).read_text())}
    paths = {t.path for t in chosen}
    stale = [k for k in equivalents if k.split("::")[0] in paths and k not in generated]
    report(scores, stale)
    low = [s for s in scores if s.percent is not None and s.percent < args.fail_under]
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
