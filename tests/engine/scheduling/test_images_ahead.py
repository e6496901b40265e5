"""A vision executor encodes an image ahead of the chunk that reaches it, a slice a round
(Scheduler.image_ready): the chunk stops before an image whose encoder output is not ready,
the round carries that encoder work, the request says it waits for it, and other requests'
decode rounds go on meanwhile. No torch: readiness is a set of digests here."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.scheduling.request import Request
from engine.scheduling.scheduler import Scheduler
from engine.vision.placement import ImageInput
from tests.engine.scheduling.sched_helpers import ids, make, step

CFG = EngineConfig(max_running=4, max_prefill_tokens=64, kv_tokens=512, page_size=4,
                   prefix_cache=False)


def _with_images(rid: str, *at: int) -> Request:
    req = make(rid, 40, 2)
    req.images = tuple(ImageInput(f"{rid}-{i}", None, offset, 8)
                       for i, offset in enumerate(at))
    return req


def test_a_chunk_waits_for_its_image_while_other_requests_decode() -> None:
    ready: set[str] = set()
    sched = Scheduler(CFG)
    sched.image_ready = ready.__contains__
    sched.add(make("text", 6, 20))
    step(sched)  # text's prompt: it decodes from here on
    req = _with_images("pic", 10)
    sched.add(req)
    batch, _ = step(sched)
    # the text before the image, beside text's decode; the image's encoder work in the round
    assert ids(batch) == [("text", 1), ("pic", 10)] or ids(batch) == [("pic", 10)]
    assert batch is not None and batch.encodes == (req,)
    for _ in range(3):  # the encoder is not done: text decodes, pic computes nothing
        batch, _ = step(sched)
        assert ids(batch) == [("text", 1)] and batch is not None and batch.encodes == (req,)
        assert sched.wait_reasons()["pic"].text == "encoding image 1 of 1"
    ready.add("pic-0")
    batch, _ = step(sched)
    assert ("pic", 30) in ids(batch) and batch is not None and batch.encodes == ()
    sched.cancel("pic", 0.0)
    sched.cancel("text", 0.0)
    sched.check_accounting()
    assert sched.kv.free == sched.kv.total


def test_alone_the_round_is_encoder_work_only() -> None:
    ready: set[str] = set()
    sched = Scheduler(CFG)
    sched.image_ready = ready.__contains__
    req = _with_images("pic", 0, 20)  # an image first, a second one after some text
    sched.add(req)
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "encode" and batch.items == ()
    assert batch.encodes == (req,) and req.slot is not None  # admitted: slot and KV held
    sched.image_progress = lambda digest: "layer 2 of 27"  # the executor's, which it asks
    assert sched.wait_reasons()["pic"].text == "encoding image 1 of 2, layer 2 of 27"
    sched.image_progress = None
    ready.add("pic-0")
    batch, _ = step(sched)
    assert ids(batch) == [("pic", 20)]  # image 1 and the text up to image 2
    assert batch is not None and batch.encodes == (req,)  # image 2 is next
    assert sched.wait_reasons()["pic"].text == "encoding image 2 of 2"
    ready.add("pic-1")
    batch, _ = step(sched)
    assert ids(batch) == [("pic", 20)] and batch is not None and batch.encodes == ()
    while sched.has_work:
        step(sched)
    sched.check_accounting()


def test_only_the_next_image_is_encoded_ahead() -> None:
    """Image 2's encoder work waits until image 1 is computed: encoded ahead, it could push
    image 1's rows out of a small cache while image 1's chunks still need them."""
    ready: set[str] = {"pic-0"}
    sched = Scheduler(EngineConfig(max_running=2, max_prefill_tokens=4, kv_tokens=512,
                                   page_size=4, prefix_cache=False))
    sched.image_ready = ready.__contains__
    req = _with_images("pic", 0, 20)
    sched.add(req)
    batch, _ = step(sched)
    assert ids(batch) == [("pic", 4)] and batch is not None and batch.encodes == ()


def test_without_image_ready_the_chunk_reaches_the_image() -> None:
    """An executor that encodes inline (the simulator's, a text model's): chunks as before."""
    sched = Scheduler(CFG)
    sched.add(_with_images("pic", 10))
    batch, _ = step(sched)
    assert ids(batch) == [("pic", 40)] and batch is not None and batch.encodes == ()
