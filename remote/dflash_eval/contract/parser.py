"""The harness's command line as a grammar: `eval`, `features`, `extract`, `export`,
`served-eval`, `plan`, `diagnose` and `served`, each with its flags, the run options among
them derived from the option table (options.py). What each command does is dflash_eval.cli's.

Stdlib only: the workstation parses a run's harness argv with this same parser (its defaults
included) to tell, before the run, what it will be compared by.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from dflash_eval.contract import options as run_options
from dflash_eval.contract.errors import HarnessError


def _argument_type(option: run_options.Option) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return run_options.parse(option, text)
        except HarnessError as error:  # argparse names the flag itself
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{option.flag}: ")) from None

    convert.__name__ = option.kind  # argparse names the kind when a value fails
    return convert


# Commands that take some of eval's options as eval reads them: `export` those that say which
# drafter a checkpoint is, `served-eval` those that build the prompts as eval builds them.
SHARED = {
    "export": (
        *("checkpoint", "target", "drafter_config", "block_size", "mask_token_id"),
        *("target_layer_ids", "drafter_profile", "accept_default", "safe_globals"),
        "allow_unsafe_pickle",
    ),
    "served-eval": ("target", "prompts", "num_prompts", "thinking", "max_new_tokens", "step"),
}


def _add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """The table's options that `command` takes (dflash_eval.contract.options declares each
    once)."""
    if command in SHARED:
        taken = [option for option in run_options.OPTIONS if option.name in SHARED[command]]
    else:
        taken = run_options.for_command(command)
    for option in taken:
        described = run_options.help_text(option)
        if option.kind == "switch":
            parser.add_argument(option.flag, action="store_true", help=described)
            continue
        choices = ("on", "off") if option.kind == "on-off" else option.choices
        parser.add_argument(
            option.flag,
            type=_argument_type(option),
            default=run_options.default(option.name),
            required=option.required,
            metavar="{" + ",".join(choices) + "}" if choices else None,
            help=described,
        )


def _add_progress_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress-file", type=Path, help="also append the JSON events here")
    parser.add_argument("--quiet", action="store_true", help="no events or messages, just the file")


def _add_features_command(commands: argparse._SubParsersAction) -> None:
    features = commands.add_parser(
        "features",
        help="compute a target's completions and hidden states into a feature set directory",
    )
    _add_options(features, "features")
    features.add_argument(
        "--out", type=Path, required=True, help="feature set directory to write (SETDIR)"
    )
    features.add_argument(
        "--layers",
        type=_argument_type(run_options.BY_NAME["target_layer_ids"]),
        required=True,
        help="target layer ids, comma-separated",
    )
    features.add_argument(
        "--block-size",
        type=_argument_type(run_options.BY_NAME["block_size"]),
        required=True,
        help="reference tokens past each completion: the largest drafter block size to serve",
    )
    features.add_argument(
        "--sglang",
        "--sglang-url",
        dest="sglang_url",
        help="get completions from SGLang's /generate at this URL (@FILE reads it from FILE)",
    )
    features.add_argument(
        "--host-name", help="this host's name in the inventory, recorded as the features' host"
    )
    features.add_argument(
        "--check-space",
        action="store_true",
        help="only report the set's size (an upper bound) and the free space where it goes, as "
        "a `space` event; compute nothing",
    )
    _add_progress_flags(features)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash_eval",
        description="Evaluate DFlash drafter checkpoints on CPU (acceptance length τ).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("eval", help="evaluate a drafter checkpoint against a target")
    _add_options(run, "eval")
    run.add_argument("--out", type=Path, required=True, help="results JSON to write")
    run.add_argument("--training-run", help="record the training run the checkpoint belongs to")
    run.add_argument(
        "--features",
        type=Path,
        help="feature set directory (from `features`): completions and hidden states are read "
        "from it, never computed here",
    )
    _add_progress_flags(run)
    _add_features_command(commands)

    strip = commands.add_parser(
        "extract", help="training checkpoint → safetensors + config (no optimizer)"
    )
    strip.add_argument("--checkpoint", type=Path, required=True, help="training checkpoint.pt")
    strip.add_argument("--out", type=Path, required=True, help="output directory")
    strip.add_argument(
        "--drafter-config", type=Path, help="config.json to write when the checkpoint carries none"
    )
    _add_options(strip, "extract")
    export = commands.add_parser(
        "export",
        help="drafter checkpoint → Hugging Face drafter directory (config.json with "
        "dflash_config + model.safetensors), its settings resolved as eval resolves them",
    )
    _add_options(export, "export")
    export.add_argument("--out", type=Path, required=True, help="drafter directory to write")
    _add_progress_flags(export)
    _add_served_eval_parser(commands)
    _add_plan_parser(commands)
    _add_diagnose_parser(commands)
    served = commands.add_parser(
        "served",
        help="ask the SGLang server whose URL is on stdin (so no credential reaches argv) "
        "what it serves; refused unless it is --target",
    )
    served.add_argument("--target", type=Path, required=True, help="target model directory")
    return parser


def _add_served_eval_parser(commands: argparse._SubParsersAction) -> None:
    """`served-eval`: eval's prompt flags, sent to a running SGLang DFLASH server."""
    served = commands.add_parser(
        "served-eval",
        help="the acceptance length a running SGLang DFLASH server gets on eval's prompts "
        "(completion tokens / verification steps per request)",
    )
    _add_options(served, "served-eval")
    served.add_argument("--sglang-url", required=True, help="the server (@FILE reads it)")
    served.add_argument("--out", type=Path, required=True, help="served record JSON to write")
    served.add_argument(
        "--num-draft-tokens", type=int, required=True, help="the server's block size (recorded)"
    )
    served.add_argument("--drafter", required=True, help="the drafter it serves (recorded)")
    served.add_argument("--gpus", help="CUDA_VISIBLE_DEVICES it started with (recorded)")
    _add_progress_flags(served)


def _add_diagnose_parser(commands: argparse._SubParsersAction) -> None:
    """`diagnose`: eval's run flags; --reference-drafter is the drafter to compare with."""
    diagnose = commands.add_parser(
        "diagnose",
        help="why is this drafter worse than --reference-drafter: ranked findings",
    )
    _add_options(diagnose, "diagnose")
    diagnose.add_argument("--out", type=Path, required=True, help="diagnosis JSON to write")
    diagnose.add_argument(
        "--against", default="reference", help="the other drafter's name in the findings"
    )
    diagnose.add_argument("--training-run", help="the training run the candidate belongs to")
    _add_progress_flags(diagnose)
    diagnose.set_defaults(features=None)


def _add_plan_parser(commands: argparse._SubParsersAction) -> None:
    """`plan`: eval's run flags (so the same argv works), no --out: it writes nothing."""
    plan = commands.add_parser(
        "plan",
        help="what an eval with these flags would find cached, compute, need and take",
        description="Takes eval's run flags. The checkpoint may be absent (not staged yet); "
        "--max-blocks, --chunk-anchors and --per-block are accepted and ignored.",
    )
    _add_options(plan, "plan")
    plan.add_argument(
        "--inputs-on-stdin",
        action="store_true",
        help="read a JSON object from stdin whose keys prompts, drafter_config, "
        "drafter_profile (file contents) and sglang_url stand in for those flags: nothing "
        "needs uploading first",
    )
    plan.add_argument(
        "--diagnose",
        action="store_true",
        help="plan a `diagnose` with --reference-drafter as the other drafter: the repairs "
        "it would try, on how many prompts, and its time",
    )
    # eval's flags that plan does not take, for _eval_options: --out a path that cannot be
    # written (a plan writes nothing), no training run, no feature set.
    plan.set_defaults(
        out=Path("/nonexistent/plan-writes-nothing"), training_run=None, features=None
    )
