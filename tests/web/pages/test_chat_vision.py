"""Pictures through the chat page to a vision model served for real (the seeded tiny LLaVA of
tests/tools/tiny_llava.py): a picture sent in the chat gets the reply the API gives for the
same message and picture (greedy), which is transformers' own; another picture another
reply; regenerate and Continue send the pictures again; the API's limits hold for the chat
(too many pixels refused at upload, a stored picture above the limit or beyond `max_images`
never reaches the engine, and the reply says so)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_llava import TOKENS_PER_IMAGE, build, chat_server, content, png, reference
from web.pages.chat.prompting import ConversationModel
from web.storage.images import NewImage

HTMX = {"HX-Request": "true"}
QUESTION = "What is in the picture?"
TOKENS = 6


@pytest.fixture(scope="module")
def llava(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("chat-llava")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(make_server: Any, llava: tuple[Path, Any]) -> Any:
    return chat_server(make_server, llava[0], default_max_tokens=TOKENS, chat_temperature=0.0,
                       chat_ignore_eos=True, max_images=2, max_image_pixels=50 * 50)


def client(server: Any) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=120, headers=HTMX)


def finished(server: Any, waiter: Any, cid: int) -> Any:
    store = server.services.store
    waiter(lambda: store.messages(cid)[-1].status != "streaming", 120, message="the reply")
    return store.messages(cid)[-1]


def chat(c: httpx.Client, text: str, pictures: list[bytes]) -> int:
    created = c.post("/c", data={"content": text},
                     files=[("images", (f"{i}.png", p, "image/png"))
                            for i, p in enumerate(pictures)])
    assert created.status_code == 201, created.text
    return int(created.headers["hx-redirect"].rsplit("/", 1)[1])


def api(server: Any, text: str, pictures: list[bytes]) -> dict[str, Any]:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "", "messages": [{"role": "user", "content": content(text, pictures)}],
        "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_picture_in_the_chat_gets_the_apis_reply(server: Any, llava: tuple[Path, Any],
                                                   waiter: Any, idle_check: Any) -> None:
    folder, model = llava
    replies = {}
    with client(server) as c:
        for seed in (0, 1):
            picture = png(seed)
            cid = chat(c, QUESTION, [picture])
            reply = finished(server, waiter, cid)
            want = api(server, QUESTION, [picture])
            assert reply.status == "complete" and reply.note is None, reply
            assert reply.content == want["choices"][0]["message"]["content"]
            assert reply.prompt_tokens == want["usage"]["prompt_tokens"]
            assert (reply.prompt_tokens, reply.content) == reference(folder, model, QUESTION,
                                                                     [picture], TOKENS)
            replies[seed] = (cid, reply)
        assert replies[0][1].content != replies[1][1].content  # the model sees the picture
        # regenerate: the picture goes again, so greedy gives the same reply
        cid, first = replies[0]
        again = c.post(f"/c/{cid}/messages/{first.id}/regenerate")
        assert again.status_code == 200, again.text
        assert finished(server, waiter, cid).content == first.content
    idle_check(server.engine)


def test_continue_sends_the_pictures_again(server: Any, waiter: Any, idle_check: Any) -> None:
    """A reply cut at a 2-token limit goes on: its prompt holds the picture's tokens, which
    the engine refuses without the picture itself."""
    store = server.services.store
    with client(server) as c:
        created = c.post("/c", data={"content": "hi"})
        cid = int(created.headers["hx-redirect"].rsplit("/", 1)[1])
        finished(server, waiter, cid)
        assert c.post(f"/c/{cid}/settings", data={
            "system_prompt": "", "temperature": "0", "top_p": "", "max_tokens": "2"}
                      ).status_code == 200
        sent = c.post(f"/c/{cid}/messages", data={"content": QUESTION},
                      files=[("images", ("p.png", png(4), "image/png"))])
        assert sent.status_code == 200, sent.text
        cut = finished(server, waiter, cid)
        assert cut.finish_reason == "length" and cut.completion_tokens == 2
        went = c.post(f"/c/{cid}/messages/{cut.id}/continue")
        assert went.status_code == 200, went.text
        done = finished(server, waiter, cid)
        assert done.id == cut.id and done.status == "complete", done
        assert done.completion_tokens == 4 and done.content.startswith(cut.content)
        assert done.prompt_tokens is not None and done.prompt_tokens > TOKENS_PER_IMAGE
        assert store.messages(cid)[-1].error is None
    idle_check(server.engine)


def test_the_apis_limits_hold_for_the_chat(server: Any, waiter: Any, idle_check: Any) -> None:
    store = server.services.store
    with client(server) as c:
        # too many pixels or pictures for one request: refused at upload, as the API does
        big = c.post("/c", data={"content": "big"},
                     files=[("images", ("big.png", png(0, (60, 50)), "image/png"))])
        assert big.status_code == 413 and "at most 2,500" in big.text, big.text
        many = c.post("/c", data={"content": "many"},
                      files=[("images", (f"{i}.png", png(i), "image/png")) for i in range(3)])
        assert many.status_code == 400 and "at most 2" in many.text, many.text
        # a picture stored under a larger limit (an older server's) never reaches the engine
        cid = chat(c, "one", [png(5)])
        plain = finished(server, waiter, cid)
        assert plain.prompt_tokens is not None and plain.prompt_tokens > TOKENS_PER_IMAGE
        large = png(6, (60, 50))
        store.add_message(cid, "user", "and this large one?", images=[NewImage(
            "image/png", 60, 50, large, large, "image/png")])
        history = store.messages(cid)
        conv = store.conversation(cid)
        assert conv is not None
        p = ConversationModel(server.services).prompt(conv, history)
        assert len(p.images) == 1 and p.note is not None
        assert "1 picture was not sent: it has more than 2,500 pixels" in p.note
        # a third picture: the oldest goes no more (at most 2 a request)
        store.delete_message(history[-1].id)
        for seed in (7, 8):
            sent = c.post(f"/c/{cid}/messages", data={"content": "next"},
                          files=[("images", ("n.png", png(seed), "image/png"))])
            assert sent.status_code == 200, sent.text
            reply = finished(server, waiter, cid)
        assert reply.note is not None and "the oldest picture was not sent" in reply.note
        assert reply.status == "complete"
    idle_check(server.engine)


def test_the_turns_carry_each_picture_before_its_text(server: Any, waiter: Any) -> None:
    """The prompt's turns for a model that takes pictures: a data: URL per picture, then the
    message's text (the order LLaVA-style models are trained on)."""
    import base64

    store = server.services.store
    picture = png(9)
    with client(server) as c:
        cid = chat(c, "Describe it.", [picture])
        finished(server, waiter, cid)
    conv = store.conversation(cid)
    assert conv is not None
    turns, unsent = ConversationModel(server.services)._turns(conv, store.messages(cid))
    assert unsent == [] and turns[1]["role"] == "assistant"
    image, text = turns[0]["content"]
    assert text == {"type": "text", "text": "Describe it."}
    prefix, data = image["image_url"]["url"].split(",", 1)
    assert prefix == "data:image/png;base64" and base64.b64decode(data) == picture


def test_the_bubble_says_which_image_is_encoded(make_server: Any, llava: tuple[Path, Any],
                                                waiter: Any, idle_check: Any) -> None:
    """A prompt read 8 tokens a round, each round slowed (the fault injected: this machine
    is too fast to see a round) and the tiny tower run a layer a round: while its encoder
    runs, the reply's status names the image and its layer, then the reply streams as
    usual."""
    import time

    slow = chat_server(make_server, llava[0], engine={"max_prefill_tokens": 8},
                       default_max_tokens=TOKENS, chat_temperature=0.0, chat_ignore_eos=True)
    executor = slow.engine.executor
    run = executor.run
    executor.images.slice_s = 0.0

    def slowed(batch: Any) -> Any:
        time.sleep(0.3)
        return run(batch)
    executor.run = slowed
    store = slow.services.store
    with client(slow) as c:
        cid = chat(c, QUESTION, [png(2)])
        reply = store.messages(cid)[-1]
        said = []
        with c.stream("GET", f"/c/{cid}/messages/{reply.id}/stream") as events:
            kind = ""
            for line in events.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind == "status":
                    said.append(line[6:])
                elif kind == "done":
                    break
        done = finished(slow, waiter, cid)
    layers = slow.engine.vision.layers
    assert any(s.startswith(f"Encoding image 1 of 1, layer {layers} of {layers} · reading "
                            "your message") for s in said), said
    assert done.status == "complete" and done.completion_tokens == TOKENS
    executor.run = run
    idle_check(slow.engine)


@pytest.mark.parametrize("pictures", [0, 1])
def test_the_placeholder_typed_as_text_is_refused(server: Any, pictures: int) -> None:
    """`<image>` in the words would run on the placeholder's own embedding: a 400 notice,
    and no conversation is left behind."""
    store = server.services.store
    count = len(store.conversations("local"))
    with client(server) as c:
        refused = c.post("/c", data={"content": "<image> what is it?"},
                         files=[("images", ("p.png", png(3), "image/png"))] * pictures)
    assert refused.status_code == 400, refused.text
    assert "image" in refused.text and refused.headers["hx-retarget"] == "#notice"
    assert len(store.conversations("local")) == count
