"""benchmarks/vision.py without servers: a new picture per request, and the records it
appends (a time renders as how many times sooner, lower being better)."""
from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image

from benchmarks import render, vision
from benchmarks.records import append, load


def test_each_request_sends_a_picture_of_its_own() -> None:
    first, second = vision.picture(0), vision.picture(1)
    assert first != second and first == vision.picture(0)
    image = Image.open(io.BytesIO(base64.b64decode(first.split(",", 1)[1])))
    assert image.size == (640, 480) and image.format == "PNG"


def test_records_round_trip_and_render(tmp_path: Path) -> None:
    ferry = {"ttft": [30.0, 34.0], "decode": [12.0, 12.5], "peak": [5400.0]}
    peer = {"ttft": [200.0, 220.0], "decode": [13.0, 13.5], "peak": [5450.0]}
    records = vision.make_records(ferry, peer, model="synthetic Gemma 3 4B", threads=2,
                                  tokens=32, peer_build="version: 10470 (abc)", notes="")
    assert [r.metric for r in records] == ["time to first token (s)", "decode tok/s",
                                           "peak resident MB"]
    assert records[0].ferry == (30.0, 34.0) and records[0].peer == vision.PEER
    assert "speculative decoding off" in records[0].method
    assert render.ratio(records[0]) == "6.56x sooner"  # 210 / 32
    assert render.ratio(records[1]) == "0.92x"
    assert records[0].workload.endswith("tower in Q8_0 (default)")
    exact = vision.make_records(ferry, peer, model="synthetic Gemma 3 4B", threads=2,
                                tokens=32, peer_build="b10470", notes="", tower="none")
    assert exact[0].workload.endswith("as the file stores it (--mmproj-quantize none)")
    path = tmp_path / "records.jsonl"
    for record in records:
        append(record, path)
    assert load(path) == records


def test_the_gap_beside_a_picture_records_as_how_many_times_shorter() -> None:
    records = vision.make_records({"gap": [1.5, 2.5]}, {"gap": [30.0, 34.0]},
                                  model="synthetic Qwen2.5-VL 3B", threads=2, tokens=32,
                                  peer_build="b10470", notes="", beside=True)
    assert [r.metric for r in records] == ["longest gap between tokens (s)"]
    assert records[0].workload == ("another reply while a picture is read, Ferry's tower "
                                   "in Q8_0 (default)")
    assert "--beside" in records[0].method and "two slots" in records[0].method
    assert render.ratio(records[0]) == "16.00x shorter"  # 32 / 2
