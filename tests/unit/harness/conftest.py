"""Fixtures for the harness tests: the lab's tiny models, trained once per machine (the
cache every lab copies from), and an SGLang stand-in."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from dflash_lab.content import MODEL_CACHE
from dflash_lab.models import LabModels, build_lab_models
from tests.sglang_stand_in import serve

from .helpers import loader_drafter


@pytest.fixture(scope="session")
def lab() -> LabModels:
    return build_lab_models(MODEL_CACHE)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # Tiny tensors: one thread is fastest and keeps results independent of machine load.
    # A run sets its own count (its host's cores by default): the tests' runs pass
    # threads=1, or the suite's parallel workers oversubscribe the cores many times over.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def drafter():
    """The loader tests' drafter (fitting LOADER_TARGET); modules that test another drafter
    define their own `drafter`."""
    return loader_drafter()


@pytest.fixture
def sglang_url():
    """The URL of an SGLang stand-in (tests/sglang_stand_in.py) on loopback, fresh state."""
    server = serve()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
