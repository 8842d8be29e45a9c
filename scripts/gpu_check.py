"""GPU check (not part of CI): run the harness's CUDA paths on a tiny random hybrid target.

    python scripts/gpu_check.py [--layers 8] [--tokens 96]

On a machine whose torch sees a GPU it builds a tiny Qwen3.5-style target (linear and full
attention layers, random weights) in a temporary directory and checks, printing one line per
result and a verdict:

1. fidelity: the target's features on CUDA (bf16 and float32, with whatever kernels this
   venv has: fla and causal-conv1d, or transformers' torch fallbacks) against the CPU float32
   torch reference, per layer, with the harness's own bounds; and which kernels each forward
   really ran (target/kernels.py);
2. sharding: the target split over every visible GPU (target/placement.py) gives the features of
   the target on one GPU, and every weight is where the plan put it;
3. drafter: a random DFlash drafter's block logits on CUDA equal its CPU logits within
   tolerance;
4. eval: `eval --device cuda` (target features and drafter on the GPU) on the lab's tiny
   target and trained drafter gives the τ of `--device cpu`, within tolerance, and records
   the GPU in `host.device`;
5. served (with `--sglang-python PATH`, the python of an SGLang installation): the lab's
   trained drafter exported (`export`), real SGLang started with it (`--speculative-algorithm
   DFLASH`) on the first GPU, the harness's `served-eval` against it: the served τ against the
   CPU harness's τ in SGLang's count (what the lab's stand-in cannot show: docs/served.md).

Without CUDA it says so in one line and exits 0. The checks take their devices as
arguments, so tests/unit/harness/test_gpu_check.py runs them on CPU "devices".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "remote"), str(ROOT)]

from dflash_eval.contract.errors import HarnessError  # noqa: E402
from dflash_eval.drafter.config import DrafterConfig  # noqa: E402
from dflash_eval.drafter.model import DFlashDrafter  # noqa: E402
from dflash_eval.target.features import judge  # noqa: E402
from dflash_eval.target.fidelity import compare_layers  # noqa: E402
from dflash_eval.target.model import load_target  # noqa: E402
from dflash_eval.target.placement import Shard  # noqa: E402

DRAFTER_TOLERANCE = 2e-3  # relative, float32 logits of a tiny drafter on two devices
TAU_TOLERANCE = 0.02  # relative: a near-tie argmax may flip between devices, rarely
SHARD_TOLERANCE = 1e-5  # relative: the same kernels on different cards


def build_target(directory: Path, layers: int = 8, seed: int = 0, width: int = 128) -> Path:
    """A tiny random Qwen3.5 text model (three linear-attention layers to one full one),
    `width` wide, with four attention heads (two KV heads) of width / 4 in either kind."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    heads, head_width = 4, width // 4
    config = Qwen3_5TextConfig(
        vocab_size=4 * width,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=head_width,
        linear_key_head_dim=head_width,
        linear_value_head_dim=head_width,
        linear_num_key_heads=heads // 2,
        linear_num_value_heads=heads,
    )
    Qwen3_5ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(directory))
    return directory


def _tokens(count: int) -> list[int]:
    return torch.randint(3, 500, (count,), generator=torch.Generator().manual_seed(1)).tolist()


def check_fidelity(target_dir: Path, device: str, tokens: list[int]) -> list[str]:
    """Per layer, features on `device` (bf16, float32) against CPU float32 torch kernels."""
    layers = list(range(load_target(target_dir, "float32").num_layers))
    reference = load_target(target_dir, "float32").hidden_features(tokens, layers)
    lines = []
    for dtype in ("bfloat16", "float32"):
        target = load_target(target_dir, dtype, device)
        rows = compare_layers(target.hidden_features(tokens, layers), reference)
        worst = max(rows.values(), key=lambda row: row["relative_error"])
        verdict = "ok" if not judge(rows) else "PAST BOUNDS"
        lines.append(
            f"fidelity {dtype} on {device}: kernels {target.kernels_run}; worst layer relative "
            f"error {worst['relative_error']:.3g}, cosine min "
            f"{min(r['cosine_min'] for r in rows.values()):.5f}: {verdict}"
        )
        lines += [
            f"  layer {layer}: relative error {row['relative_error']:.3g}, cosine mean "
            f"{row['cosine_mean']:.6f}, min {row['cosine_min']:.6f}"
            for layer, row in rows.items()
        ]
    return lines


def check_sharding(target_dir: Path, devices: list[str], tokens: list[int]) -> list[str]:
    """The target split over `devices` gives the features of the target on the first one."""
    whole = load_target(target_dir, "bfloat16", devices[0])
    layers = list(range(whole.num_layers))
    expected = whole.hidden_features(tokens, layers)
    del whole
    sharded = load_target(target_dir, "bfloat16", devices[0], shard=Shard(tuple(devices)))
    rows = compare_layers(sharded.hidden_features(tokens, layers), expected)
    worst = max(row["relative_error"] for row in rows.values())
    verdict = "ok" if worst <= SHARD_TOLERANCE else "DIFFERS"
    placement = sharded.placement.record() if sharded.placement else None
    return [
        f"sharding over {len(devices)} device(s) {devices}: layers {placement['layers']}, "
        f"weight bytes {placement['weight_bytes']}",
        f"  features against one device: worst relative error {worst:.3g} "
        f"(tolerance {SHARD_TOLERANCE}): {verdict}",
    ]


def check_drafter(device: str) -> list[str]:
    """A random drafter's logits for one block on `device` against the CPU's."""
    config = DrafterConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        target_layer_ids=(1, 5),
        block_size=8,
        mask_token_id=3,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
    )
    generator = torch.Generator().manual_seed(2)
    drafter = DFlashDrafter(config).eval()
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    features = torch.randn(40, 2 * 128, generator=generator)
    embed = torch.randn(512, 128, generator=generator)
    ids = torch.tensor([7] + [config.mask_token_id] * (config.block_size - 1))

    def logits(on: str) -> torch.Tensor:
        model = drafter.to(on)
        # As the harness walks on a GPU: the positions and masks the model makes go there too.
        with torch.no_grad(), torch.device(on):
            ctx = model.fuse_context(features.to(on))
            hidden = model.forward_uncached(ctx, model.embed_block(embed.to(on), ids.to(on)))
            return model.logits(hidden, embed.to(on)).cpu()

    expected = logits("cpu")
    try:
        found = logits(device)
    except (RuntimeError, HarnessError) as error:
        return [f"drafter on {device}: FAILED: {str(error).splitlines()[0]}"]
    error = float((found - expected).norm() / expected.norm())
    same = bool((found.argmax(-1) == expected.argmax(-1)).all())
    verdict = "ok" if error <= DRAFTER_TOLERANCE and same else "DIFFERS"
    return [
        f"drafter on {device}: logits relative error {error:.3g} (tolerance "
        f"{DRAFTER_TOLERANCE}), same greedy drafts: {same}: {verdict}"
    ]


def check_eval(device: str, workdir: Path, models: Path | None = None) -> list[str]:
    """The lab's tiny target and step-6000 drafter evaluated on `device` and on the CPU.
    `models`: where the lab models are (built there if missing); default under workdir."""
    from dflash_eval.contract.progress import Progress
    from dflash_eval.run.evaluate import run_eval
    from dflash_eval.run.options import EvalOptions

    from dflash_lab.models import build_lab_models

    lab = build_lab_models(models or workdir / "lab-models")

    def results(on: str) -> dict:
        options = EvalOptions(
            checkpoint=lab.checkpoints[max(lab.checkpoints)],
            target=lab.target_dir,
            out=workdir / f"results-{on}.json",
            prompts=lab.prompts,
            num_prompts=4,
            max_new_tokens=48,
            cache_dir=workdir / f"cache-{on.replace(':', '-')}",
            device=on,
        )
        return run_eval(options, Progress(quiet=True))

    cpu, gpu = results("cpu"), results(device)
    expected, found = cpu["metrics"]["tau_macro"], gpu["metrics"]["tau_macro"]
    apart = abs(found - expected) / expected
    verdict = "ok" if apart <= TAU_TOLERANCE else "DIFFERS"
    return [
        f"eval on {gpu['host'].get('device')} (features on {gpu['features']['device']}): "
        f"tau macro {found:.4f} against {expected:.4f} on cpu, {apart:.2%} apart (tolerance "
        f"{TAU_TOLERANCE:.0%}): {verdict}"
    ]


def check_served(
    sglang_python: str, workdir: Path, models: Path | None = None, port: int = 30123
) -> list[str]:
    """Real SGLang serving the lab's tiny target with its trained drafter exported: served τ
    (completion tokens / verification steps) against the CPU τ of the same prompts."""
    import json
    import os
    import signal
    import subprocess
    import time
    import urllib.request

    from dflash_eval.cli import main as harness

    from dflash_lab.models import build_lab_models
    from dflash_ops.evaluation.served_agreement import agreement, in_sglangs_count
    from dflash_ops.evaluation.served_records import verdict

    lab = build_lab_models(models or workdir / "lab-models")
    step, drafter = max(lab.checkpoints), workdir / "drafter"
    target = ["--target", str(lab.target_dir)]
    harness(["export", "--checkpoint", str(lab.checkpoints[step]), *target, "--out", str(drafter)])
    block = json.loads((drafter / "config.json").read_text())["block_size"]
    argv = [sglang_python, "-m", "sglang.launch_server", "--model-path", str(lab.target_dir)]
    argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter)]
    argv += ["--speculative-num-draft-tokens", str(block), "--host", "127.0.0.1"]
    log = (workdir / "sglang.log").open("w")
    server = subprocess.Popen(
        [*argv, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    prompts = ["--prompts", str(lab.prompts), "--num-prompts", "4", "--max-new-tokens", "48"]
    try:
        deadline = time.monotonic() + 900
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    tail = (workdir / "sglang.log").read_text()[-600:]
                    return [f"served: FAILED: SGLang did not come up; its log ends: {tail}"]
                time.sleep(1)
        out, url = workdir / "served.json", f"http://127.0.0.1:{port}"
        served_argv = ["served-eval", *target, "--sglang-url", url, "--out", str(out)]
        served_argv += ["--num-draft-tokens", str(block), "--drafter", str(drafter), *prompts]
        harness(served_argv)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=120)
    cpu_out = workdir / "served-cpu.json"
    checkpoint = ["--checkpoint", str(lab.checkpoints[step])]
    harness(["eval", *checkpoint, *target, "--out", str(cpu_out), *prompts, "--ddtree", "4"])
    cpu_results, record = json.loads(cpu_out.read_text()), json.loads(out.read_text())
    counted, macro = in_sglangs_count(cpu_results), record["served"]["tau_macro"]
    if counted is None or macro is None:
        return ["served: FAILED: no verification step (the server did not speculate)"]
    cpu = counted["tau_macro"]
    judged = agreement(cpu_results, record, cpu, macro)  # the rule compare and diagnose apply
    return [
        f"served: SGLang DFLASH τ macro {macro['value']:.4f} [{macro['low']}, {macro['high']}] "
        f"against the CPU's {cpu['value']:.4f} [{cpu['low']}, {cpu['high']}] in SGLang's "
        f"count, {verdict(judged)}: {'ok' if judged['agree'] else 'DIFFERS'}"
    ]


def run_checks(checks: list[tuple[str, Callable[[], list[str]]]]) -> bool:
    """Print each check's lines; True when none failed or raised."""
    passed = True
    for name, check in checks:
        try:
            lines = check()
        except Exception as error:  # a check that crashes is a finding, not the end
            lines = [f"{name}: FAILED: {type(error).__name__}: {str(error).splitlines()[0]}"]
        for line in lines:
            print(line, flush=True)
        passed &= not any(word in line for line in lines for word in ("FAILED", "DIFFERS", "PAST"))
    return passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the target")
    parser.add_argument("--tokens", type=int, default=96, help="tokens of the test sequence")
    parser.add_argument(
        "--sglang-python", help="python of an SGLang installation: also the served check"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_check: skipped: torch {torch.__version__} sees no CUDA device here")
        return 0
    devices = [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    names = ", ".join(torch.cuda.get_device_name(index) for index in range(len(devices)))
    print(f"gpu_check: torch {torch.__version__}, {len(devices)} GPU(s): {names}")
    tokens = _tokens(args.tokens)
    with tempfile.TemporaryDirectory() as scratch:
        target_dir = build_target(Path(scratch) / "target", args.layers)
        passed = run_checks(
            [
                ("fidelity", lambda: check_fidelity(target_dir, devices[0], tokens)),
                ("sharding", lambda: check_sharding(target_dir, devices, tokens)),
                ("drafter", lambda: check_drafter(devices[0])),
                ("eval", lambda: check_eval(devices[0], Path(scratch))),
            ]
            + [("served", lambda: check_served(args.sglang_python, Path(scratch)))]
            * bool(args.sglang_python)
        )
    print(f"gpu_check: {'all checks passed' if passed else 'SOME CHECKS FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
