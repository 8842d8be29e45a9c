"""Named prompt sets on the workstation: small local data files the tests write, read by the
real `datasets` loading code, formatted as z-lab's benchmark formats them, sampled as it
samples them, cached, and written as the prompts file the harness reads.

This machine cannot reach the Hugging Face hub and tests talk to nothing but lab hosts and
loopback: the hub is switched off (HF_HUB_OFFLINE) for every test here.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dflash_eval.contract.prompts import read_prompts_jsonl

from dflash_ops.core.errors import DatasetError, OpsError
from dflash_ops.evaluation.dataset_cache import load_set
from dflash_ops.evaluation.datasets import parse_sets, prompt_records
from dflash_ops.evaluation.request import build_request, dataset_prompts
from tests.conftest import run_fab

ASK = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("DFLASH_DATASETS_CACHE", str(tmp_path / "cache"))


def parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def gsm8k_file(path: Path, count: int = 10) -> Path:
    return parquet(
        path,
        [
            {"question": f"Janet has {n} ducks. How many?", "answer": f"#### {n}"}
            for n in range(count)
        ],
    )


def mt_bench_file(path: Path) -> Path:
    rows = [
        {"prompt_id": 81 + n, "category": "writing", "prompt": [f"Write {n}.", f"Rewrite {n}."]}
        for n in range(3)
    ]
    return parquet(path, rows)


def records(sets: str, count: int | None = None) -> list[dict]:
    loaded = [load_set(request) for request in parse_sets(sets)]
    return [record for each in loaded for record in prompt_records(each, count)]


def test_each_set_is_formatted_as_zlabs_benchmark_formats_it(tmp_path):
    humaneval = tmp_path / "humaneval.jsonl"
    humaneval.write_text(
        json.dumps(
            {
                "task_id": "HumanEval/0",
                "prompt": 'def add(a, b):\n    """Sum."""\n',
                "canonical_solution": "    return a + b\n",
                "test": "assert add(1, 2) == 3",
                "entry_point": "add",
            }
        )
        + "\n"
    )
    mbpp = tmp_path / "mbpp.jsonl.gz"
    with gzip.open(mbpp, "wt") as handle:
        row = {"task_id": 2, "prompt": "Write a function to add two numbers.", "code": "..."}
        handle.write(json.dumps(row) + "\n")
    math = parquet(tmp_path / "math.parquet", [{"problem": "Find $x$.", "answer": "2"}])
    sets = (
        f"gsm8k={gsm8k_file(tmp_path / 'gsm8k.parquet', 1)},math500={math},"
        f"humaneval={humaneval},mbpp={mbpp},mt-bench={mt_bench_file(tmp_path / 'mt.parquet')}"
    )
    prompts = {record["id"]: record for record in records(sets)}
    assert prompts["gsm8k-0"]["prompt"] == "Janet has 0 ducks. How many?" + ASK
    assert prompts["math500-0"]["prompt"] == "Find $x$." + ASK
    assert prompts["humaneval-0"]["prompt"] == (
        "Write a solution to the following problem and make sure that it passes the tests:\n"
        '```python\ndef add(a, b):\n    """Sum."""\n\n```'
    )
    assert prompts["mbpp-0"]["prompt"] == "Write a function to add two numbers."
    assert prompts["mt-bench-1"]["turns"] == ["Write 1.", "Rewrite 1."]
    assert {record["dataset"] for record in prompts.values()} == {
        "gsm8k", "math500", "humaneval", "mbpp", "mt-bench",
    }  # fmt: skip


def test_sampling_picks_the_rows_zlabs_benchmark_picks(tmp_path):
    path = gsm8k_file(tmp_path / "gsm8k.parquet", 10)
    chosen = [record["id"] for record in records(f"gsm8k={path}", 4)]
    # z-lab's transformers backend: random.seed(0), then random.shuffle(dataset)[:N] over
    # the rows in dataset order.
    rows = [f"gsm8k-{n}" for n in range(10)]
    state = random.getstate()
    try:
        random.seed(0)
        random.shuffle(rows)
    finally:
        random.setstate(state)
    assert chosen == rows[:4]
    assert chosen != [f"gsm8k-{n}" for n in range(4)]
    assert [record["id"] for record in records(f"gsm8k={path}", 4)] == chosen
    everything = records(f"gsm8k={path}", 10)
    assert [record["id"] for record in everything] == [f"gsm8k-{n}" for n in range(10)]
    assert everything[0]["source"]["sampled"] is False


def test_the_source_names_the_files_and_the_selected_rows_hash(tmp_path):
    path = gsm8k_file(tmp_path / "gsm8k.parquet", 10)
    four, other_four = records(f"gsm8k={path}", 4), records(f"gsm8k={path}", 5)[:4]
    source = four[0]["source"]
    assert source["files"] == "gsm8k.parquet"
    assert len(source["files_sha256"][0]) == 64
    assert (source["rows"], source["selected"], source["seed"], source["sampled"]) == (
        10,
        4,
        0,
        True,
    )
    assert source["format"].startswith("z-lab/dflash")
    assert source["selected_rows_sha256"] != other_four[0]["source"]["selected_rows_sha256"]
    assert all(record["source"] == source for record in four)


def test_a_set_is_read_once_then_from_the_cache_and_again_when_its_files_change(tmp_path):
    path = gsm8k_file(tmp_path / "gsm8k.parquet", 6)
    said: list[str] = []
    [request] = parse_sets(f"gsm8k={path}")
    first = load_set(request, say=said.append)
    second = load_set(request, say=said.append)
    assert "read from gsm8k.parquet" in said[0] and "from the cache" in said[1]
    assert second.rows == first.rows and second.origin == first.origin
    gsm8k_file(path, 7)  # new contents: the cached rows no longer describe this file
    [request] = parse_sets(f"gsm8k={path}")
    assert len(load_set(request, say=said.append).rows) == 7
    assert "read from" in said[2]


def test_a_set_not_cached_and_not_reachable_says_how_to_prefetch_it(tmp_path):
    [request] = parse_sets("humaneval")
    with pytest.raises(DatasetError) as caught:
        load_set(request)
    message = str(caught.value)
    assert "openai/openai_humaneval" in message and "not in the cache" in message
    assert "fab fetch-datasets --dataset humaneval" in message
    assert "--dataset humaneval=PATH" in message


def test_unknown_sets_missing_files_and_missing_fields_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="unknown prompt set 'gsm9k'; known sets: gsm8k"):
        parse_sets("gsm9k")
    with pytest.raises(DatasetError, match="is not a file"):
        parse_sets(f"gsm8k={tmp_path / 'absent.parquet'}")
    wrong = parquet(tmp_path / "wrong.parquet", [{"problem": "not a gsm8k row"}])
    with pytest.raises(DatasetError, match="row 0 has no field question"):
        records(f"gsm8k={wrong}")
    with pytest.raises(DatasetError, match="at least 1"):
        records(f"gsm8k={gsm8k_file(tmp_path / 'g.parquet')}", 0)


def test_the_prompts_file_is_what_the_harness_reads(tmp_path):
    gsm8k, mt_bench = gsm8k_file(tmp_path / "g.parquet"), mt_bench_file(tmp_path / "m.parquet")
    sets = f"gsm8k={gsm8k},mt-bench={mt_bench}"
    path = dataset_prompts(sets, 2, tmp_path / "sets", lambda message: None)
    again = dataset_prompts(sets, 2, tmp_path / "sets", lambda message: None)
    assert again == path  # named by its contents: the same sets give the same file
    prompts = read_prompts_jsonl(path)
    assert [p.dataset for p in prompts] == ["gsm8k"] * 2 + ["mt-bench"] * 4
    assert [p.follows is None for p in prompts[2:]] == [True, False, True, False]
    assert prompts[0].source["files"] == "g.parquet"


def test_run_eval_flags_with_sets_build_and_upload_the_prompts_file(tmp_path):
    sets = f"gsm8k={gsm8k_file(tmp_path / 'g.parquet')}"
    request = build_request(
        step=2000,
        host=None,
        harness_options={"num_prompts": 3, "max_new_tokens": 24, "thinking": "on"},
        prompts=None,
        dataset=sets,
        prompt_sets_dir=tmp_path / "sets",
    )
    assert request.prompts is not None and request.prompts.parent == tmp_path / "sets"
    assert len(read_prompts_jsonl(request.prompts)) == 3
    # --num-prompts was drawn per set here; passed on, the harness would cut the file again.
    assert request.harness_args == ["--max-new-tokens", "24", "--thinking", "on"]
    with pytest.raises(OpsError, match="pass one of them"):
        build_request(
            step=1, host=None, harness_options={}, prompts=str(request.prompts), dataset=sets
        )
    with pytest.raises(OpsError, match="--thinking: expected one of on, off, found 'yes'"):
        build_request(step=1, host=None, harness_options={"thinking": "yes"}, prompts=None)


def test_fab_fetch_datasets_caches_local_files_and_explains_an_unreachable_hub(tmp_path):
    path = gsm8k_file(tmp_path / "gsm8k.parquet", 5)
    fetched = run_fab(None, "fetch-datasets", "--dataset", f"gsm8k={path}", timeout=120)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert "gsm8k: 5 rows" in fetched.stdout
    again = run_fab(None, "fetch-datasets", "--dataset", f"gsm8k={path}", timeout=120)
    assert "from the cache" in again.stdout
    missing = run_fab(None, "fetch-datasets", "--dataset", "mt-bench", timeout=120)
    assert missing.returncode == 1
    assert "Traceback" not in missing.stderr
    assert "fab fetch-datasets --dataset mt-bench" in missing.stderr
