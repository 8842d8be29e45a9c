"""The report's decoded samples: per round, the target's tokens and the drafter's, the
accepted prefix highlighted and the first rejected token marked (report.html.j2 draws them).

Results written before samples carried tokens show the round's text as it was recorded;
fields a newer harness adds (to a sample or a round) are shown as plain text, never dropped.
"""

from __future__ import annotations

from typing import Any

from dflash_eval.contract.schema_metrics import Sample, SampleRound

from dflash_ops.evaluation.results import RunResult
from dflash_ops.ui.report_facts import short

KNOWN = {"id", "dataset", "completion_start", "rounds"}
KNOWN_ROUND = {"position", "anchor", "accepted", "target", "draft", "target_tokens", "draft_tokens"}
# How a token's invisible characters are shown (the token stays whole otherwise).
VISIBLE = str.maketrans({"\n": "↵", "\t": "⇥"})


def run_samples(rows: list[RunResult]) -> list[dict[str, Any]]:
    """Each run that carries samples, the latest one shown open."""
    shown = []
    for row in rows:
        samples = row.results["samples"] if row.results else []
        if samples:
            step = f"{row.training_run} step {row.step}" if row.training_run else f"step {row.step}"
            shown.append(
                {
                    "title": f"{row.run_id} ({step})",
                    "open": False,
                    "samples": [_sample(s) for s in samples],
                }
            )
    if shown:
        shown[-1]["open"] = True
    return shown


def _sample(sample: Sample) -> dict[str, Any]:
    return {
        "id": sample["id"],
        "dataset": sample.get("dataset"),
        "completion": short(sample["completion_start"], 4000),
        "rounds": [_round(r) for r in sample["rounds"]],
        "extra": [(str(k), short(v, 400)) for k, v in sample.items() if k not in KNOWN],
    }


def _round(shown: SampleRound) -> dict[str, Any]:
    accepted = shown["accepted"]
    draft, target = shown.get("draft_tokens"), shown.get("target_tokens")
    tokens = draft is not None and target is not None
    return {
        "position": shown["position"],
        "anchor": _visible(shown["anchor"]),
        "accepted": accepted,
        "slots": len(draft) if draft is not None else None,
        "draft": _marked(draft, accepted, "miss") if tokens else [(shown["draft"], "")],
        "target": _marked(target, accepted, "want") if tokens else [(shown["target"], "")],
        "extra": [(str(k), short(v, 200)) for k, v in shown.items() if k not in KNOWN_ROUND],
    }


def _marked(tokens: list[str], accepted: int, first_wrong: str) -> list[tuple[str, str]]:
    """Each token with its class: 'ok' for the accepted prefix, `first_wrong` for the slot
    after it, 'rest' for the slots the round never reached."""
    marks = []
    for slot, token in enumerate(tokens):
        mark = "ok" if slot < accepted else first_wrong if slot == accepted else "rest"
        marks.append((_visible(token), mark))
    return marks


def _visible(token: str) -> str:
    return token.translate(VISIBLE) if token else "∅"
