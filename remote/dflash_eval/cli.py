"""Command line: `python -m dflash_eval eval …`, `… features …`, `… extract …`, `… export …`,
`… served-eval …`, `… plan …`, `… diagnose …` and `… served …`: each command's flags
(contract/parser.py) handed to the package that runs it. The top of the harness's ladder: the
one module that sees them all.

Exit status: 0 success; 2 an expected failure (HarnessError: the message says what to do,
no traceback); 130 interrupted. stdout carries JSON-line events only; people read stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from dflash_eval.contract import options as run_options
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.parser import build_parser
from dflash_eval.contract.progress import Progress
from dflash_eval.contract.summary import headline, summary_lines
from dflash_eval.contract.urls import read_url
from dflash_eval.reference.sglang_server import check_serves, completions_url
from dflash_eval.run.options import EvalOptions

# Commands that never need torch (a dry run, asking an SGLang server): their process hides it.
# transformers then loads a tokenizer without it (the same class and token ids), and any import
# of torch fails loudly instead of costing seconds.
WITHOUT_TORCH = ("plan", "served")


def entry(argv: list[str] | None = None) -> int:
    """The harness as a process (`python -m dflash_eval`, and the workstation's in-memory
    loader): `main`, with torch hidden from the commands that never need it."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in WITHOUT_TORCH and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        # transformers' advice that torch is missing is for people who meant to load a model.
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    return main(argv)


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
        if args.command == "export":
            return _export(args, progress)
        if args.command == "served-eval":
            return _served_eval(args, progress)
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
    options = _eval_options(args, given)
    if args.diagnose:
        from dflash_eval.diagnose import dry_run

        plan = dry_run.make_diagnose_plan(options)
        progress.say("\n".join(summary_lines(plan) + dry_run.summary_lines(plan)))
    else:
        plan = make_plan(options)
        progress.say("\n".join(summary_lines(plan)))
    progress.event("plan", plan=plan)
    return 0


def _diagnose(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.contract.diagnose_summary import summary_lines
    from dflash_eval.diagnose.diagnosis import DiagnoseOptions, run_diagnose

    options = DiagnoseOptions(_eval_options(args, given={}), args.against)
    diagnosis = run_diagnose(options, progress)
    progress.say("\n".join(summary_lines(diagnosis)))
    progress.event("done", out=str(args.out), findings=len(diagnosis["findings"]))
    return 0


def _served(args: argparse.Namespace, progress: Progress) -> int:
    """`fab check-hosts` asks this on the host, which reaches the server."""
    served = check_serves(sys.stdin.read().strip(), args.target)
    progress.event("served", **served.record())
    return 0


def _export(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.drafter.pickle_policy import PicklePolicy
    from dflash_eval.run.export import ExportOptions, export_drafter

    progress.event("start", command="export", checkpoint=str(args.checkpoint), out=str(args.out))
    options = ExportOptions(
        checkpoint=args.checkpoint,
        target=args.target,
        out=args.out,
        drafter_config=args.drafter_config,
        drafter_profile=args.drafter_profile,
        block_size=args.block_size,
        mask_token_id=args.mask_token_id,
        target_layer_ids=args.target_layer_ids,
        accept_default=tuple(args.accept_default),
        pickle_policy=PicklePolicy(tuple(args.safe_globals), args.allow_unsafe_pickle),
    )
    summary = export_drafter(options)
    progress.say(
        f"Exported {args.checkpoint} → {args.out}: {summary['parameters']} parameters, block "
        f"size {summary['block_size']}, config from {summary['config_source']}"
    )
    progress.event("done", out=str(args.out), summary=summary)
    return 0


def _served_eval(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.run.served_eval import ServedOptions, run_served

    options = ServedOptions(
        target=args.target,
        sglang_url=read_url(args.sglang_url),
        out=args.out,
        prompts=args.prompts,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        thinking=args.thinking,
        block_size=args.num_draft_tokens,
        drafter=args.drafter,
        step=args.step,
        gpus=args.gpus,
    )
    served = run_served(options, progress)["served"]
    macro, pooled = served["tau_macro"], served["tau_pooled"]
    shown = f"{macro['value']:.3f}" if macro else "n/a"
    progress.say(f"served τ macro {shown}, pooled {pooled['value']:.3f}" if pooled else shown)
    progress.event("done", out=str(args.out), served=served)
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
