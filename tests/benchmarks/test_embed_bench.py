"""benchmarks/embed.py without servers: its workloads (distinct texts, the long one within
a BERT model's positions) and the records it appends (well-formed, rendered like others)."""
from __future__ import annotations

from pathlib import Path

from benchmarks import embed, render
from benchmarks.records import Record, append, load


def test_workloads_send_distinct_texts_of_the_stated_batch() -> None:
    short, concurrent, batched, long = embed.workloads(16, "abc", clients=8)
    assert len(short.texts(0)) == 1 and len(batched.texts(0)) == 16
    assert not set(batched.texts(0)) & set(batched.texts(1))
    assert short.texts(0) != short.texts(1)
    assert (concurrent.clients, short.clients) == (8, 1) and "8 clients" in concurrent.name
    assert not {t for r in range(50) for t in concurrent.texts(r)} & \
        {t for r in range(50) for t in short.texts(r)}
    words = long.texts(0)[0].split()
    assert len(words) == embed.LONG_WORDS


def test_measure_counts_texts_over_wall_time() -> None:
    sent: list[list[str]] = []
    figure = embed.measure(sent.append, embed.workloads(4, "n")[2], 3, 0)
    assert [len(t) for t in sent] == [4, 4, 4] and figure > 0


def test_concurrent_clients_each_send_their_requests_at_once() -> None:
    """C clients send K requests each, with up to C in flight: every request once."""
    import threading
    import time

    lock, sent, flight, most = threading.Lock(), [], [0], [0]

    def post(texts: list[str]) -> None:
        with lock:
            flight[0] += 1
            most[0] = max(most[0], flight[0])
        time.sleep(0.01)
        with lock:
            flight[0] -= 1
            sent.extend(texts)

    work = embed.workloads(4, "n", clients=4)[1]
    figure = embed.measure(post, work, 3, 1)
    assert len(sent) == len(set(sent)) == 12 and most[0] > 1 and figure > 0
    assert set(sent) == {t for r in range(4, 16) for t in work.texts(r)}


def test_records_round_trip_and_render(tmp_path: Path) -> None:
    results = {"1 short text a request": ([50.0, 52.5], [40.0, 41.0]),
               "64 short texts a request": ([900.0, 910.0], [600.0, 610.0])}
    records = embed.make_records(results, model="all-MiniLM-L6-v2 F16 GGUF", threads=2,
                                 batch=64, repeat=5, peer_build="version: 10470 (abc)",
                                 notes="other work was running",
                                 cpu=("Some CPU, 2 threads", ("avx2",)))
    assert [r.workload for r in records] == list(results)
    first = records[0]
    assert (first.metric, first.peer, first.ferry, first.peer_figures) == \
        ("embeddings/s", embed.PEER, (50.0, 52.5), (40.0, 41.0))
    assert first.cpu == "Some CPU, 2 threads" and "alternating" in first.method
    assert not first.headline and first.notes == "other work was running"
    path = tmp_path / "records.jsonl"
    for record in records:
        append(record, path)
    back = load(path)
    assert back == records and all(Record.from_json(r.to_json()) == r for r in back)
    table = render.all_tables(back)
    assert "64 short texts a request" in table and "1.50x" in table
