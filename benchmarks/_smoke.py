"""`--smoke`, which every benchmark takes: each step at a size that runs in seconds, so that
the suite can run every benchmark (tests/benchmark_smoke.py finds them) and none rots
unseen. A smoke run's figures mean nothing."""

from __future__ import annotations

import argparse
from typing import Any


def parse_args(parser: argparse.ArgumentParser, smoke: dict[str, Any]) -> argparse.Namespace:
    """The parsed arguments, with `--smoke` added: it sets the arguments in `smoke`."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"every step at a size that runs in seconds ({smoke}); its figures mean nothing",
    )
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(smoke)
    return args
