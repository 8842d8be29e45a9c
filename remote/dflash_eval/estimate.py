"""A rough time estimate for a run, from the host's cores and CPU features (stdlib only).

The model, stated so that its numbers can be argued with:

- a forward pass costs FLOPs ≈ 2 × parameters × tokens (attention over these short contexts
  and the element-wise work are left out);
- a host computes `cores × rate` FLOP/s, the per-core rate depending on the best matrix
  unit its /proc/cpuinfo flags name (AMX tiles, AVX-512 BF16, AVX-512F, AVX2, none) and on
  the dtype: bf16 is fast only with AMX or AVX-512 BF16, otherwise it is converted and slow;
- a greedy decode step (one token, batch 1) also streams every weight once: a step takes at
  least weight bytes / memory bandwidth, assumed `cores × 4 GB/s` up to 100 GB/s. Decoding
  on CPU is bandwidth-bound far more often than compute-bound;
- reading weights or hashing a checkpoint runs at about 1 GB/s.

A phase takes max(FLOPs / compute rate, streamed bytes / bandwidth) + disk bytes / disk rate.
The rates are first guesses for PyTorch's CPU kernels (sustained, not peak); real runs may
differ by 2× either way. Call it an estimate, never a promise.
"""

from __future__ import annotations

from dataclasses import dataclass

# Best first: the class a host belongs to is the first whose flags it has all of.
FEATURE_CLASSES: tuple[tuple[str, frozenset[str]], ...] = (
    ("amx-bf16", frozenset({"amx_bf16", "amx_tile"})),
    ("avx512-bf16", frozenset({"avx512_bf16"})),
    ("avx512", frozenset({"avx512f"})),
    ("avx2", frozenset({"avx2"})),
    ("baseline", frozenset()),
)
FLAGS_OF_INTEREST = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
# Sustained GFLOP/s per core, by feature class and dtype (float16 counts as bfloat16).
GFLOPS_PER_CORE: dict[str, dict[str, float]] = {
    "amx-bf16": {"bfloat16": 250.0, "float32": 60.0},
    "avx512-bf16": {"bfloat16": 80.0, "float32": 60.0},
    "avx512": {"bfloat16": 15.0, "float32": 50.0},
    "avx2": {"bfloat16": 8.0, "float32": 25.0},
    "baseline": {"bfloat16": 2.0, "float32": 5.0},
}
BANDWIDTH_PER_CORE = 4e9  # bytes/s of weights streamed per core in a decode step
BANDWIDTH_MAX = 100e9
DISK_BYTES_PER_SECOND = 1e9  # reading weights, hashing a checkpoint


@dataclass(frozen=True)
class CpuInfo:
    processors: int  # "processor" entries in /proc/cpuinfo
    flags: frozenset[str]  # the flags of the first processor

    @property
    def feature_class(self) -> str:
        return next(name for name, needed in FEATURE_CLASSES if needed <= self.flags)

    def record(self) -> dict[str, object]:
        return {
            "processors": self.processors,
            "flags": [flag for flag in FLAGS_OF_INTEREST if flag in self.flags],
            "feature_class": self.feature_class,
        }


def parse_cpuinfo(text: str) -> CpuInfo:
    """The processor count and the first processor's flags from /proc/cpuinfo's text
    (x86 names them `flags`, arm64 `Features`)."""
    processors = 0
    flags: frozenset[str] | None = None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "processor":
            processors += 1
        elif name in ("flags", "Features") and flags is None:
            flags = frozenset(value.split())
    return CpuInfo(processors, flags or frozenset())


@dataclass(frozen=True)
class Phase:
    """The work of one phase of a run."""

    flops: float = 0.0
    dtype: str = "float32"
    streamed_bytes: float = 0.0  # weights read from memory once per decode step
    disk_bytes: float = 0.0


@dataclass(frozen=True)
class Machine:
    cores: int  # the threads the run will use
    feature_class: str

    def compute_rate(self, dtype: str) -> float:
        rates = GFLOPS_PER_CORE[self.feature_class]
        return self.cores * rates["float32" if dtype == "float32" else "bfloat16"] * 1e9

    @property
    def bandwidth(self) -> float:
        return min(self.cores * BANDWIDTH_PER_CORE, BANDWIDTH_MAX)

    def seconds(self, phase: Phase) -> float:
        compute = phase.flops / self.compute_rate(phase.dtype)
        memory = phase.streamed_bytes / self.bandwidth
        return max(compute, memory) + phase.disk_bytes / DISK_BYTES_PER_SECOND


def estimate(machine: Machine, phases: dict[str, Phase]) -> dict[str, object]:
    """Seconds per phase and in all, with the model's inputs (the results of `plan`)."""
    seconds = {name: round(machine.seconds(phase), 3) for name, phase in phases.items()}
    return {
        "seconds": round(sum(seconds.values()), 3),
        "phases": seconds,
        "cores": machine.cores,
        "feature_class": machine.feature_class,
        "gflops_per_core": GFLOPS_PER_CORE[machine.feature_class],
        "bandwidth_bytes_per_second": machine.bandwidth,
        "model": "estimate: FLOPs = 2 x parameters x tokens at cores x per-core rate; decode "
        "steps at least weight bytes / bandwidth; disk at 1 GB/s (see dflash_eval.estimate)",
    }
