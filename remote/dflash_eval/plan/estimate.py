"""A rough time estimate for a run, from the host's cores and CPU features (stdlib only).

The model, stated so that its numbers can be argued with:

- a forward pass costs FLOPs ≈ 2 × parameters × tokens (attention over these short contexts
  and the element-wise work are left out);
- a host computes `cores × rate` FLOP/s, the per-core rate depending on the best matrix
  unit its /proc/cpuinfo flags name (AMX tiles, AVX-512 BF16, AVX-512F, AVX2, none) and on
  the dtype: bf16 is fast only with AMX or AVX-512 BF16, otherwise it is converted and slow;
- a greedy decode step (one token, batch 1) also streams every weight once: a step takes at
  least weight bytes / memory bandwidth, `cores × 6.3 GB/s` up to 100 GB/s. Decoding
  on CPU is bandwidth-bound far more often than compute-bound;
- reading weights or hashing a checkpoint runs at about 3 GB/s (a cold read: a guess).

- each pass of one layer costs a fixed time besides its FLOPs (Python, kernel launches, the
  torch fallback of the linear-attention kernels looping over chunks): a decode step through
  one layer, a forward of one sequence through one layer, and the drafter's walk of one
  anchor each have their own; loading a target has a fixed start-up cost.

A phase takes max(FLOPs / compute rate, streamed bytes / bandwidth) + disk bytes / disk rate +
its fixed costs. The constants are fitted (benchmarks/target_scale.py --fit, docs/estimate.md)
on random Qwen3.5-style hybrid targets of 30 M, 150 M and 600 M parameters on a 2-core AVX-512
BF16 machine (every phase of a second run within 21 %); the other feature classes keep their
first-guess ratios to it. Call it an estimate, never a promise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Best first: the class a host belongs to is the first whose flags it has all of.
FEATURE_CLASSES: tuple[tuple[str, frozenset[str]], ...] = (
    ("amx-bf16", frozenset({"amx_bf16", "amx_tile"})),
    ("avx512-bf16", frozenset({"avx512_bf16"})),
    ("avx512", frozenset({"avx512f"})),
    ("avx2", frozenset({"avx2"})),
    ("baseline", frozenset()),
)
FLAGS_OF_INTEREST = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
# Sustained GFLOP/s per core, by feature class and dtype (float16 counts as bfloat16): the
# first guesses (60 float32 for avx512-bf16 …) times FITTED, measured on avx512-bf16 float32.
FITTED = 0.86
_FIRST_GUESSES: dict[str, dict[str, float]] = {
    "amx-bf16": {"bfloat16": 250.0, "float32": 60.0},
    "avx512-bf16": {"bfloat16": 80.0, "float32": 60.0},
    "avx512": {"bfloat16": 15.0, "float32": 50.0},
    "avx2": {"bfloat16": 8.0, "float32": 25.0},
    "baseline": {"bfloat16": 2.0, "float32": 5.0},
}
BANDWIDTH_PER_CORE = 7.4e9  # bytes/s of weights streamed per core in a decode step
BANDWIDTH_MAX = 100e9
DISK_BYTES_PER_SECOND = 3e9  # a cold read of weights (a first guess: see docs/estimate.md)
# Fixed costs, whatever the cores (fitted as the rates are):
DECODE_LAYER_STEP_S = 0.0021  # one decode step through one layer
FORWARD_LAYER_PASS_S = 0.008  # one sequence's forward through one layer
ANCHOR_WALK_S = 0.0063  # the drafter's walk of one anchor (its block and the DDTree walks)
LOAD_START_S = 1.0  # building the target's modules before its weights are read


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
    """The work of one phase of a run: what it computes, streams and reads, and how many of
    each fixed-cost pass it makes (kept as counts so that a saved plan can be refitted)."""

    flops: float = 0.0
    dtype: str = "float32"
    streamed_bytes: float = 0.0  # weights read from memory once per decode step
    disk_bytes: float = 0.0
    decode_layer_steps: float = 0.0  # decode steps × layers
    forward_layer_passes: float = 0.0  # sequence forwards × layers
    anchor_walks: float = 0.0
    target_loads: int = 0


@dataclass(frozen=True)
class Machine:
    cores: int  # the threads the run will use
    feature_class: str

    def compute_rate(self, dtype: str) -> float:
        rates = gflops_per_core(self.feature_class)
        return self.cores * rates["float32" if dtype == "float32" else "bfloat16"] * 1e9

    @property
    def bandwidth(self) -> float:
        return min(self.cores * BANDWIDTH_PER_CORE, BANDWIDTH_MAX)

    def seconds(self, phase: Phase) -> float:
        compute = phase.flops / self.compute_rate(phase.dtype)
        memory = phase.streamed_bytes / self.bandwidth
        disk = phase.disk_bytes / DISK_BYTES_PER_SECOND
        return max(compute, memory) + disk + fixed_seconds(phase)


def gflops_per_core(feature_class: str) -> dict[str, float]:
    """Sustained GFLOP/s per core of one feature class, by dtype."""
    return {dtype: round(rate * FITTED, 2) for dtype, rate in _FIRST_GUESSES[feature_class].items()}


def fixed_seconds(phase: Phase) -> float:
    """The costs that do not shrink with more cores."""
    return (
        phase.decode_layer_steps * DECODE_LAYER_STEP_S
        + phase.forward_layer_passes * FORWARD_LAYER_PASS_S
        + phase.anchor_walks * ANCHOR_WALK_S
        + phase.target_loads * LOAD_START_S
    )


def estimate(machine: Machine, phases: dict[str, Phase]) -> dict[str, object]:
    """Seconds per phase and in all, with the model's inputs (the results of `plan`)."""
    seconds = {name: round(machine.seconds(phase), 3) for name, phase in phases.items()}
    return {
        "seconds": round(sum(seconds.values()), 3),
        "phases": seconds,
        "work": {name: asdict(phase) for name, phase in phases.items()},
        "cores": machine.cores,
        "feature_class": machine.feature_class,
        "gflops_per_core": gflops_per_core(machine.feature_class),
        "bandwidth_bytes_per_second": machine.bandwidth,
        "model": "estimate: FLOPs = 2 x parameters x tokens at cores x per-core rate; decode "
        "steps at least weight bytes / bandwidth; disk at 3 GB/s; fixed costs per layer pass, "
        "per walked anchor and per target load (see dflash_eval.plan.estimate)",
    }
