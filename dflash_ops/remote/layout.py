"""Every path dflash-ops uses on an eval (or features) host, derived from its inventory entry
in one place.

{workdir}/harness/<hash>/dflash_eval   deployed harness; harness/current → the live one
{workdir}/runs/<run-id>/               one detached eval run (params, log, results, …)
{workdir}/cache/                       the harness's completion / hidden-state cache
{workdir}/features/<set-id>/           a feature set (`fab extract-features`), with
{workdir}/features/<set-id>.manifest.json  its relay manifest (eval hosts)
{workdir}/bin/uv, {workdir}/uv-cache   uv and its cache (unless the venv spec says otherwise)
{workdir}/wheelhouse/                  pushed wheels for air-gapped installs
{venv}/bin/python, {venv}/dflash-provision.json
{staging}/step_<N>/checkpoint.pt       staged checkpoints (staging: `checkpoints` or
                                       {workdir}/checkpoints), extracted/ beside them
{staging}/<run>/step_<N>/…             the same for a named training run (--run)
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_ops.core.inventory import HarnessHost

PROVISION_RECORD = "dflash-provision.json"
STAGED_NAME = "checkpoint.pt"


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


@dataclass(frozen=True)
class EvalLayout:
    entry: HarnessHost

    @property
    def workdir(self) -> str:
        return self.entry.workdir.rstrip("/")

    # --- the venv and its tools ---------------------------------------------------------

    @property
    def venv(self) -> str:
        return self.entry.venv.path.rstrip("/")

    @property
    def python(self) -> str:
        return _join(self.venv, "bin", "python")

    @property
    def provision_record(self) -> str:
        return _join(self.venv, PROVISION_RECORD)

    @property
    def uv_dir(self) -> str:
        return self.entry.venv.uv_dir or _join(self.workdir, "bin")

    @property
    def uv_cache(self) -> str:
        return self.entry.venv.cache_dir or _join(self.workdir, "uv-cache")

    @property
    def wheelhouse(self) -> str:
        return _join(self.workdir, "wheelhouse")

    # --- the harness and its runs -------------------------------------------------------

    @property
    def harness_root(self) -> str:
        return _join(self.workdir, "harness")

    @property
    def harness_current(self) -> str:
        return _join(self.harness_root, "current")

    @property
    def cache(self) -> str:
        return _join(self.workdir, "cache")

    @property
    def features(self) -> str:
        return _join(self.workdir, "features")

    def feature_set(self, set_id: str) -> str:
        return _join(self.features, set_id)

    @property
    def runs(self) -> str:
        return _join(self.workdir, "runs")

    def run(self, run_id: str) -> str:
        return _join(self.runs, run_id)

    # --- staged checkpoints -------------------------------------------------------------

    @property
    def staging(self) -> str:
        # eval hosts only: a features host stages no checkpoints
        return (self.entry.checkpoints or _join(self.workdir, "checkpoints")).rstrip("/")

    def staged_checkpoint(self, step: int, run: str | None = None) -> str:
        """Where step `step` of training run `run` (None: the trainer's own) is staged."""
        return _join(self.staging, *([run] if run else []), f"step_{step}", STAGED_NAME)

    @staticmethod
    def extracted(checkpoint: str) -> str:
        """Where the optimizer-free copy of a staged checkpoint goes (beside it)."""
        return _join(checkpoint.rpartition("/")[0] or "/", "extracted")

    @staticmethod
    def exported(checkpoint: str) -> str:
        """Where the Hugging Face drafter directory of a staged checkpoint goes (beside it)."""
        return _join(checkpoint.rpartition("/")[0] or "/", "drafter")
