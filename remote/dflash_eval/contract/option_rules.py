"""The rules between the harness's run options (stdlib only): what a value of one option means
for another. The options themselves, each with its own check, are in options.py; the harness
(walk/sampling.py) and the workstation (dflash_ops.evaluation.harness_options, before anything
is staged) apply these rules to the options a user gave.
"""

from __future__ import annotations

from collections.abc import Mapping

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.options import BY_NAME, default

# Below this, logits / T overflow float32 for ordinary logits and the sampled probabilities
# are not finite (1e-45 reached torch.multinomial as NaN); sampling there is greedy in all
# but name, and 0 says so.
MIN_TEMPERATURE = 1e-4
GREEDY_ONLY = ("top_p", "top_k", "samples", "paths")  # options that mean something only at T > 0


def check_together(given: Mapping[str, object]) -> None:
    """The rules between options, for the options a user gave (`given`: name → value; the
    others take the table's default): top-p, top-k, --samples and --paths only at T > 0, and a
    temperature either 0 or at least MIN_TEMPERATURE. A HarnessError naming the flags."""
    temperature = given.get("temperature", default("temperature"))
    if temperature == 0:
        wasted = [BY_NAME[n].flag for n in GREEDY_ONLY if given.get(n, default(n)) != default(n)]
        if wasted:
            raise HarnessError(
                f"{' and '.join(wasted)} need --temperature above 0 (T = 0 is greedy, and "
                "they would change nothing)."
            )
    elif temperature < MIN_TEMPERATURE:
        raise HarnessError(
            f"--temperature {temperature}: below {MIN_TEMPERATURE} logits / T overflow and the "
            "sampled probabilities are not finite; for greedy decoding pass --temperature 0."
        )
