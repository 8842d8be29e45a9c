"""The smallest valid inventory document (a trainer and one eval host), for the tests that
change one part of it and check what the inventory makes of that."""

from __future__ import annotations

from typing import Any


def features_host(**fields: Any) -> dict:
    """A features host entry with the keys it needs; `fields` add to or replace them."""
    return {
        "role": "features",
        "address": "g",
        "workdir": "/w",
        "venv": {"path": "/v", "torch": "cuda"},
        "target_model": "/m",
        **fields,
    }


def minimal_document(**trainer: Any) -> dict:
    """The fewest keys an inventory can have; `trainer` adds to (or replaces) the trainer's."""
    return {
        "hosts": {
            "trainer": {"role": "trainer", "address": "t", "checkpoints": "/ckpt", **trainer},
            "eval": {
                "role": "eval",
                "address": "e",
                "workdir": "/w",
                "venv": {"path": "/v"},
                "target_model": "/m",
            },
        }
    }
