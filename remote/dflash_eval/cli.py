"""Command line: `python -m dflash_eval eval …`, `… features …`, `… extract …`, `… plan …` and
`… diagnose …`.

Exit status: 0 success; 2 an expected failure (HarnessError: the message says what to do,
no traceback); 130 interrupted. stdout carries JSON-line events only; people read stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.dtypes import dtype_name
from dflash_eval.errors import HarnessError
from dflash_eval.numbers import option
from dflash_eval.progress import Progress
from dflash_eval.summary import headline, summary_lines
from dflash_eval.urls import read_url

if TYPE_CHECKING:
    from dflash_eval.evaluate import EvalOptions


# The numeric options' bounds (dflash_eval.numbers): far beyond real use, never a value
# that allocates without end.
BLOCK_SIZE = option(minimum=2, maximum=1024, unit="tokens")
TOKENS = option(minimum=1, maximum=1 << 20, unit="tokens")
THREADS = option(minimum=1, maximum=4096, unit="threads")
COUNT = option(minimum=1, maximum=1 << 24)
TOKEN_ID = option(minimum=0, maximum=1 << 24)
STEP = option(minimum=0, maximum=10**12)
LIST_ITEM = option(minimum=0, maximum=1 << 16)  # a layer id or a DDTree budget
# Sampling's own bounds are Sampling.check's (one message for them all); these keep the
# values finite and of a size nothing can be allocated from.
REAL = option(whole=False)
SIGNED = option(minimum=-(1 << 24), maximum=1 << 24)
SEED = option(minimum=0, maximum=(1 << 63) - 1)


def _int_list(text: str) -> list[int]:
    return [LIST_ITEM(part) for part in text.split(",") if part.strip()]


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _add_pickle_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--safe-globals",
        type=_name_list,
        default=[],
        help="also unpickle these inert globals (comma-separated groups argparse, numpy, "
        "pathlib, datetime, or their dotted names); nothing else beyond weights",
    )
    parser.add_argument(
        "--allow-unsafe-pickle",
        action="store_true",
        help="unpickle checkpoints that need more than weights_only (runs code!)",
    )


def _add_progress_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress-file", type=Path, help="also append the JSON events here")
    parser.add_argument("--quiet", action="store_true", help="no events or messages, just the file")


def _add_features_command(commands: argparse._SubParsersAction) -> None:
    features = commands.add_parser(
        "features",
        help="compute a target's completions and hidden states into a feature set directory",
    )
    features.add_argument("--target", type=Path, required=True, help="target model directory")
    features.add_argument(
        "--out", type=Path, required=True, help="feature set directory to write (SETDIR)"
    )
    features.add_argument(
        "--layers", type=_int_list, required=True, help="target layer ids, comma-separated"
    )
    features.add_argument(
        "--block-size",
        type=BLOCK_SIZE,
        required=True,
        help="reference tokens past each completion: the largest drafter block size to serve",
    )
    features.add_argument("--prompts", type=Path, help="JSONL prompts (default: built-in set)")
    features.add_argument(
        "--max-new-tokens", type=TOKENS, default=256, help="completion length (default 256)"
    )
    features.add_argument(
        "--thinking", choices=["on", "off"], default="off", help="enable_thinking (default off)"
    )
    features.add_argument(
        "--target-dtype",
        type=dtype_name,
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="target dtype (default: as saved; float32 for linear attention on CPU)",
    )
    features.add_argument(
        "--sglang",
        "--sglang-url",
        dest="sglang_url",
        help="get completions from SGLang's /generate at this URL (@FILE reads it from FILE)",
    )
    features.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's)")
    features.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the target runs (default auto: CUDA when torch sees a GPU, else CPU)",
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


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that describe a run, shared by `eval` and `plan` so that the same argv
    means the same run to both: each flag and its default are declared here only."""
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="training checkpoint.pt, Hugging Face DFlash dir, or extracted dir",
    )
    parser.add_argument("--target", type=Path, required=True, help="target model directory (HF)")
    _add_drafter_flags(parser)
    parser.add_argument("--prompts", type=Path, help="JSONL prompts (default: built-in set)")
    parser.add_argument(
        "--num-prompts", type=COUNT, help="use the first N prompts (more than exist: an error)"
    )
    parser.add_argument(
        "--thinking",
        choices=["on", "off"],
        default="off",
        help="enable_thinking for chat templates that have it (default off, as z-lab's benchmark)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=TOKENS,
        default=256,
        help="completion length, as z-lab's max_new_tokens (default 256)",
    )
    parser.add_argument(
        "--max-blocks", type=COUNT, help="stop each prompt's walk after this many rounds"
    )
    parser.add_argument(
        "--ddtree",
        type=_int_list,
        help="DDTree budgets, comma-separated (default 4,8,16,32, none for a DFlash-2 "
        "drafter; '' for none)",
    )
    parser.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--reference-drafter",
        type=Path,
        help="also evaluate this drafter on the same hidden states",
    )
    parser.add_argument(
        "--sglang-url",
        help="get completions from SGLang's /generate (default: local greedy); @FILE reads "
        "the URL from FILE, keeping credentials out of the command line",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "dflash-eval",
        help="completion/hidden-state cache (default ~/.cache/dflash-eval)",
    )
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    parser.add_argument(
        "--target-dtype",
        type=dtype_name,
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="target dtype (default: as saved)",
    )
    _add_pickle_flags(parser)
    parser.add_argument("--chunk-anchors", type=COUNT, help="anchors per batched drafter pass")
    parser.add_argument(
        "--per-block",
        action="store_true",
        help="one drafter forward per block (slow; for cross-checking)",
    )
    _add_sampling_flags(parser)
    parser.add_argument("--step", type=STEP, help="record this step (default: from the checkpoint)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="hash the checkpoint even when the staging manifest beside it records its sha256",
    )


def _add_drafter_flags(parser: argparse.ArgumentParser) -> None:
    """What the checkpoint may not say about the drafter, and how to read it."""
    parser.add_argument(
        "--drafter-config",
        type=Path,
        help="drafter config.json, used when the checkpoint carries none",
    )
    parser.add_argument(
        "--block-size",
        type=BLOCK_SIZE,
        help="block size B (default: the one the drafter was trained with)",
    )
    parser.add_argument(
        "--mask-token-id", type=TOKEN_ID, help="mask token id, if the config lacks it"
    )
    parser.add_argument(
        "--target-layer-ids",
        type=_int_list,
        help="comma-separated target layer ids, if the config lacks them",
    )
    parser.add_argument(
        "--drafter-profile",
        type=Path,
        help="JSON of drafter settings, parameter-name rules and pickle policy (an inventory "
        "profile, as the workstation sends it)",
    )
    parser.add_argument(
        "--accept-default",
        type=_name_list,
        default=[],
        help="confirm the default rule for these settings when nothing states them "
        "(comma-separated: target_layer_ids, rope)",
    )

    parser.add_argument(
        "--dtype",
        type=dtype_name,
        choices=["float32", "bfloat16"],
        help="drafter dtype (default: the profile's, else float32)",
    )


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """T > 0 (docs/sampling.md): the target samples the completion, the drafter its slots."""
    parser.add_argument(
        "--temperature", type=REAL, default=0.0, help="sampling temperature (default 0: greedy)"
    )
    parser.add_argument("--top-p", type=REAL, default=1.0, help="top-p at T > 0 (default 1: off)")
    parser.add_argument("--top-k", type=SIGNED, default=0, help="top-k at T > 0 (default 0: off)")
    parser.add_argument(
        "--seed", type=SEED, default=0, help="seed of the sampled completions and walks (default 0)"
    )
    parser.add_argument(
        "--samples", type=SIGNED, default=1000, help="Monte Carlo walks per prompt (default 1000)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash_eval",
        description="Evaluate DFlash drafter checkpoints on CPU (acceptance length τ).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("eval", help="evaluate a drafter checkpoint against a target")
    _add_run_flags(run)
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
    _add_pickle_flags(strip)
    _add_plan_parser(commands)
    _add_diagnose_parser(commands)
    return parser


def _add_diagnose_parser(commands: argparse._SubParsersAction) -> None:
    """`diagnose`: eval's run flags; --reference-drafter is the drafter to compare with."""
    diagnose = commands.add_parser(
        "diagnose",
        help="why is this drafter worse than --reference-drafter: ranked findings",
    )
    _add_run_flags(diagnose)
    diagnose.add_argument("--out", type=Path, required=True, help="diagnosis JSON to write")
    diagnose.add_argument(
        "--against", default="reference", help="the other drafter's name in the findings"
    )
    diagnose.add_argument(
        "--probe-prompts",
        type=COUNT,
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
    _add_run_flags(plan)
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
    from dflash_eval.evaluate import run_eval

    results = run_eval(_eval_options(args, given={}), progress)
    progress.say("\n".join(summary_lines(results)))
    progress.event("done", out=str(args.out), summary=headline(results))
    return 0


def _eval_options(args: argparse.Namespace, given: dict[str, Any]) -> EvalOptions:
    """The run's options from eval's flags, which plan parses too (its parser supplies the
    few it lacks as defaults). `given`: plan's stdin inputs, which stand in for the flags
    they name."""
    from dflash_eval.evaluate import EvalOptions

    url = given.get("sglang_url") or (read_url(args.sglang_url) if args.sglang_url else None)
    return EvalOptions(
        checkpoint=args.checkpoint,
        target=args.target,
        out=args.out,
        drafter_config=given.get("drafter_config", args.drafter_config),
        block_size=args.block_size,
        mask_token_id=args.mask_token_id,
        target_layer_ids=args.target_layer_ids,
        prompts=given.get("prompts", args.prompts),
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        max_blocks=args.max_blocks,
        ddtree=args.ddtree,
        threads=args.threads,
        reference_drafter=args.reference_drafter,
        sglang_url=url,
        cache_dir=None if args.no_cache else args.cache_dir,
        dtype=args.dtype,
        target_dtype=args.target_dtype,
        allow_unsafe_pickle=args.allow_unsafe_pickle,
        safe_globals=args.safe_globals,
        drafter_profile=given.get("drafter_profile", args.drafter_profile),
        accept_default=args.accept_default,
        chunk=args.chunk_anchors,
        per_block=args.per_block,
        step=args.step,
        training_run=args.training_run,
        thinking=args.thinking == "on",
        verify=args.verify,
        features=args.features,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        samples=args.samples,
    )


def _features(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.features_run import FeaturesOptions, run_features

    options = FeaturesOptions(
        target=args.target,
        out=args.out,
        layers=args.layers,
        block_size=args.block_size,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        thinking=args.thinking == "on",
        target_dtype=args.target_dtype,
        sglang_url=read_url(args.sglang_url) if args.sglang_url else None,
        threads=args.threads,
        host_name=args.host_name,
        device=args.device,
        check_space=args.check_space,
    )
    summary = run_features(options, progress)
    progress.event("done", out=str(args.out), summary=summary)
    return 0


def _plan(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.plan import make_plan, summary_lines
    from dflash_eval.plan_inputs import stdin_inputs

    given = stdin_inputs(sys.stdin.read()) if args.inputs_on_stdin else {}
    plan = make_plan(_eval_options(args, given))
    progress.say("\n".join(summary_lines(plan)))
    progress.event("plan", plan=plan)
    return 0


def _diagnose(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.diagnose import DiagnoseOptions, run_diagnose
    from dflash_eval.diagnose_summary import summary_lines

    options = DiagnoseOptions(_eval_options(args, given={}), args.against, args.probe_prompts)
    diagnosis = run_diagnose(options, progress)
    progress.say("\n".join(summary_lines(diagnosis)))
    progress.event("done", out=str(args.out), findings=len(diagnosis["findings"]))
    return 0


def _extract(args: argparse.Namespace, progress: Progress) -> int:
    from dflash_eval.extract import extract
    from dflash_eval.pickle_policy import PicklePolicy

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
