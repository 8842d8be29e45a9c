"""A training run's metrics log read at the evaluated steps (dflash_ops.evaluation.training_log
and tfevents): JSON lines, CSV and TensorBoard event files written by tensorboardX (an
independent writer, protobuf and all), the line being written left out, a step logged twice
keeping its last value, and every malformed log one line naming where and what."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dflash_ops.core.errors import MetricsLogError
from dflash_ops.core.metrics_log import MetricsLog
from dflash_ops.evaluation import tfevents
from dflash_ops.evaluation.training_log import values_at


def log(format: str, fields=("loss", "acc"), **more) -> MetricsLog:
    return MetricsLog(path="/workspace/metrics", format=format, fields=list(fields), **more)


JSONL = b"""{"config": {"lr": 0.001}}
{"step": 1000, "loss": 3.5, "acc": 0.1, "lr": 0.001}
{"step": 2000, "loss": 2.5, "acc": 0.2}
{"step": 2000, "loss": 2.25}

{"step": 3000, "loss": NaN, "acc": 0.3}
{"step": 4000, "loss": 1.5, "ac"""


def test_jsonl_values_at_the_evaluated_steps_the_last_write_winning():
    found = values_at(log("jsonl"), [("m.jsonl", JSONL)], {2000, 3000, 4000})
    # 2000 was logged again (a resumed run): its loss is the later one, its acc the only one
    assert found[2000] == {"loss": 2.25, "acc": 0.2}
    assert found[3000] == {"loss": "nan", "acc": 0.3}  # a diverged loss stays visible
    assert 4000 not in found  # its line is still being written: no newline yet
    assert 1000 not in found  # not evaluated


def test_a_step_key_other_than_step():
    data = b'{"global_step": 7, "train/loss": 0.5}\n'
    found = values_at(log("jsonl", ["train/loss"], step_key="global_step"), [("m", data)], {7})
    assert found == {7: {"train/loss": 0.5}}


CSV = b"""step,loss,acc,lr
1000,3.5,0.1,0.001
2000,2.5,,0.001
2000,2.0,0.25,0.001
3000,inf,0.3,0.001
4000,1.5,0.4"""


def test_csv_values_an_empty_cell_being_no_value():
    found = values_at(log("csv"), [("m.csv", CSV)], {2000, 3000, 4000})
    assert found == {2000: {"loss": 2.0, "acc": 0.25}, 3000: {"loss": "inf", "acc": 0.3}}


@pytest.mark.parametrize(
    ("fmt", "data", "message"),
    [
        ("jsonl", b'{"step": 1, "loss": 1}\nnot json\n', r"^m: line 2: not JSON; expected one"),
        ("jsonl", b"[1, 2]\n", r"^m: line 1: expected a JSON object, found list$"),
        ("jsonl", b'{"step": "soon", "loss": 1}\n', r"^m: line 1: step: expected a training s"),
        ("jsonl", b'{"step": 2.5}\n', r"^m: line 1: step: expected a training step .*2\.5"),
        ("jsonl", b'{"step": 2, "loss": "low"}\n', r"^m: line 1: loss: expected a number, fou"),
        ("jsonl", b'{"step": 2, "acc": true}\n', r"^m: line 1: acc: expected a number, found"),
        ("jsonl", b"\xff\xfe{}\n", r"^m: byte 0: not UTF-8 text; is `format` right"),
        ("csv", b"step,loss\n2,1\n", r"^m: line 1: no column acc; its columns: step, loss"),
        ("csv", b"step,loss,acc\n2,1\n", r"^m: line 2: 2 cells where the header has 3 columns"),
        ("csv", b"step,loss,acc\n2,x,1\n", r"^m: line 2: loss: expected a number, found 'x'$"),
    ],
)
def test_a_malformed_text_log_is_one_line_naming_where(fmt, data, message):
    with pytest.raises(MetricsLogError, match=message) as raised:
        values_at(log(fmt), [("m", data)], {2})
    assert "\n" not in str(raised.value)


# --- TensorBoard --------------------------------------------------------------------------


def write_events(directory: Path, scalars: list[tuple[int, str, float]]) -> Path:
    """An event file written by tensorboardX's SummaryWriter (simple_value scalars)."""
    tensorboardX = pytest.importorskip("tensorboardX")
    writer = tensorboardX.SummaryWriter(str(directory))
    for step, tag, value in scalars:
        writer.add_scalar(tag, value, step)
    writer.close()
    (path,) = directory.glob("events.out.tfevents.*")
    return path


def test_tensorboard_scalars_from_an_independent_writer(tmp_path):
    path = write_events(
        tmp_path,
        [(1000, "loss", 3.5), (2000, "loss", 2.5), (2000, "acc", 0.2), (3000, "loss", 1.5)],
    )
    found = values_at(log("tensorboard"), [("ev", path.read_bytes())], {2000, 3000})
    assert found == {2000: {"loss": 2.5, "acc": pytest.approx(0.2)}, 3000: {"loss": 1.5}}


def test_tensorboard_tensor_scalars_as_tf2_writes_them(tmp_path):
    """TF2's tf.summary.scalar: a one-element float tensor instead of simple_value (built
    with tensorboardX's protobuf classes, then framed as TFRecords)."""
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2

    def record(step: int, tag: str, value: float, double: bool) -> bytes:
        tensor = (
            tensor_pb2.TensorProto(dtype=2, double_val=[value])
            if double
            else tensor_pb2.TensorProto(dtype=1, float_val=[value])
        )
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor)])
        data = event_pb2.Event(step=step, wall_time=1.0, summary=summary).SerializeToString()
        length = len(data).to_bytes(8, "little")
        crc = tfevents.masked_crc
        return length + crc(length).to_bytes(4, "little") + data + crc(data).to_bytes(4, "little")

    data = record(5, "loss", 0.75, False) + record(5, "acc", 0.125, True)
    assert values_at(log("tensorboard"), [("ev", data)], {5}) == {5: {"loss": 0.75, "acc": 0.125}}


def test_crc32c_is_the_castagnoli_checksum():
    assert tfevents.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_a_tensorboard_record_cut_short_at_the_end_is_one_being_written(tmp_path):
    data = write_events(tmp_path, [(1, "loss", 1.0), (2, "loss", 0.5)]).read_bytes()
    found = values_at(log("tensorboard"), [("ev", data[:-3])], {1, 2})
    assert found == {1: {"loss": 1.0}}


def test_a_damaged_or_foreign_event_file_is_one_line(tmp_path):
    data = bytearray(write_events(tmp_path, [(1, "loss", 1.0)]).read_bytes())
    data[-6] ^= 0xFF  # inside the last record's value: its data checksum no longer matches
    with pytest.raises(MetricsLogError, match=r"^ev: byte \d+: the event's checksum does not m"):
        values_at(log("tensorboard"), [("ev", bytes(data))], {1})
    with pytest.raises(MetricsLogError, match=r"^ev: byte 0: not a TFRecord .* event file$"):
        values_at(log("tensorboard"), [("ev", JSONL)], {1})


def test_a_non_finite_tensorboard_value_is_kept_by_name(tmp_path):
    path = write_events(tmp_path, [(1, "loss", math.inf)])
    assert values_at(log("tensorboard"), [("ev", path.read_bytes())], {1}) == {1: {"loss": "inf"}}
