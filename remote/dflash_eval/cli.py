"""Command line: `python -m dflash_eval eval …`, `… features …`, `… extract …`, `… plan …`,
`… diagnose …` and `… served …`.

Exit status: 0 success; 2 an expected failure (HarnessError: the message says what to do,
no traceback); 130 interrupted. stdout carries JSON-line events only; people read stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.contract import options as run_options
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.numbers import option as bounded
from dflash_eval.contract.progress import Progress
from dflash_eval.contract.summary import headline, summary_lines
from dflash_eval.contract.urls import read_url
from dflash_eval.reference.sglang_server import check_serves, completions_url

if TYPE_CHECKING:
    from dflash_eval.run.evaluate import EvalOptions


# diagnose's --probe-prompts, outside the option table: bounded as --num-prompts is, from 2
# (a probe's interval needs two prompts; fab diagnose refuses fewer alike).
PROBE_PROMPTS = bounded(minimum=2, maximum=run_options.MAX_PROMPTS, unit="prompts")


def _argument_type(option: run_options.Option) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return run_options.parse(option, text)
        except HarnessError as error:  # argparse names the flag itself
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{option.flag}: ")) from None

    convert.__name__ = option.kind  # argparse names the kind when a value fails
    return convert


def _add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """The table's options that `command` takes (dflash_eval.contract.options declares each
    once)."""
    for option in run_options.for_command(command):
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
    _add_plan_parser(commands)
    _add_diagnose_parser(commands)
    served = commands.add_parser(
        "served",
        help="ask the SGLang server whose URL is on stdin (so no credential reaches argv) "
        "what it serves; refused unless it is --target",
    )
    served.add_argument("--target", type=Path, required=True, help="target model directory")
    return parser


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
    diagnose.add_argument(
        "--probe-prompts",
        type=PROBE_PROMPTS,
        default=4,
        help="prompts each probe re-evaluates the candidate on (default 4)",
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
    # eval's flags that plan does not take, for _eval_options: --out a path that cannot be
    # written (a plan writes nothing), no training run, no feature set.
    plan.set_defaults(
        out=Path("/nonexistent/plan-writes-nothing"), training_run=None, features=None
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = Progress(
        progress_file=getattr(args, "progress_file", None), quiet=getattr(args, "quiet", False)
    )
    try:
        if args.command == "eval":
            return _eval(args, progress)
        if args.command == "features":
            return _features(args, progress)
        if args.command == "plan":
            return _plan(args, progress)
        if args.command == "diagnose":
            return _diagnose(args, progress)
        if args.command == "served":
            return _served(args, progress)
        return _extract(args, progress)
    except HarnessError as error:
        progress.event("error", message=str(error))
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        progress.event("error", message="interrupted")
        return 130
    finally:
        progress.close()


def _eval(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.run.evaluate import run_eval

    results = run_eval(_eval_options(args, given={}), progress)
    progress.say("\n".join(summary_lines(results)))
    progress.event("done", out=str(args.out), summary=headline(results))
    return 0


def _eval_options(args: argparse.Namespace, given: dict[str, Any]) -> EvalOptions:
    """The run's options from eval's flags, which plan parses too (its parser supplies the
    few it lacks as defaults). `given`: plan's stdin inputs, which stand in for the flags
    they name."""
    from dflash_eval.run.evaluate import EvalOptions

    values = {
        option.name: getattr(args, option.name)
        for option in run_options.for_command("eval")
        if option.stored
    }
    values.update(given)
    if "sglang_url" not in given and args.sglang_url:
        values["sglang_url"] = read_url(args.sglang_url)
    values["sglang_url"] = completions_url(args.completions, values["sglang_url"])
    if args.no_cache:
        values["cache_dir"] = None
    return EvalOptions(
        **values, out=args.out, training_run=args.training_run, features=args.features
    )


def _features(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.run.features import FeaturesOptions, run_features

    options = FeaturesOptions(
        target=args.target,
        out=args.out,
        layers=args.layers,
        block_size=args.block_size,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        thinking=args.thinking,
        target_dtype=args.target_dtype,
        sglang_url=read_url(args.sglang_url) if args.sglang_url else None,
        threads=args.threads,
        host_name=args.host_name,
        device=args.device or "auto",
        check_space=args.check_space,
        shard_gpus=args.shard_gpus,
        gpu_memory=args.gpu_memory,
    )
    summary = run_features(options, progress)
    progress.event("done", out=str(args.out), summary=summary)
    return 0


def _plan(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.plan.dry_run import make_plan, summary_lines
    from dflash_eval.plan.inputs import stdin_inputs

    given = stdin_inputs(sys.stdin.read()) if args.inputs_on_stdin else {}
    plan = make_plan(_eval_options(args, given))
    progress.say("\n".join(summary_lines(plan)))
    progress.event("plan", plan=plan)
    return 0


def _diagnose(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.contract.diagnose_summary import summary_lines
    from dflash_eval.diagnose.diagnosis import DiagnoseOptions, run_diagnose

    options = DiagnoseOptions(_eval_options(args, given={}), args.against, args.probe_prompts)
    diagnosis = run_diagnose(options, progress)
    progress.say("\n".join(summary_lines(diagnosis)))
    progress.event("done", out=str(args.out), findings=len(diagnosis["findings"]))
    return 0


def _served(args: argparse.Namespace, progress: Progress) -> int:
    """`fab check-hosts` asks this on the host, which reaches the server."""
    served = check_serves(sys.stdin.read().strip(), args.target)
    progress.event("served", **served.record())
    return 0


def _extract(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.drafter.pickle_policy import PicklePolicy
    from dflash_eval.run.extract import extract

    progress.event("start", command="extract", checkpoint=str(args.checkpoint), out=str(args.out))
    policy = PicklePolicy(tuple(args.safe_globals), args.allow_unsafe_pickle)
    summary = extract(args.checkpoint, args.out, policy, args.drafter_config)
    before, after = summary["size_before_bytes"], summary["size_after_bytes"]
    progress.say(
        f"Extracted {args.checkpoint} → {args.out}: {before / 1e6:.1f} MB → {after / 1e6:.1f} MB "
        f"({after / before:.0%}); dropped {summary['dropped_entries']}"
    )
    if not summary["config_written"]:
        progress.warn(f"{args.checkpoint} carries no config; none written (pass --drafter-config)")
    progress.event("done", out=str(args.out), summary=summary)
    return 0
