"""Pictures in the chat over HTTP: attached to a message (multipart), checked (not a picture,
too large, too many, over the conversation's limit: a 4xx notice and nothing stored), served
from the store to their owner only, carried by export and import, deleted with the
conversation; a text-only model never gets them and its reply says so; the CSP stays
strict. A vision model getting them: test_chat_vision.py."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from web.config import WebConfig

IMAGES_PER_MESSAGE = WebConfig(data_dir=Path(".")).max_images  # the API's max_images

HTMX = {"HX-Request": "true"}


def png(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    picture = Image.new("RGB", (width, height))
    picture.putdata([((x * 4 + seed) % 256, (y * 5) % 256, (x * y + seed) % 256)
                     for y in range(height) for x in range(width)])
    out = io.BytesIO()
    picture.save(out, "PNG")
    return out.getvalue()


def noise_png(side: int) -> bytes:
    """A PNG that does not compress (random pixels): about 3 bytes a pixel."""
    import random
    rng = random.Random(side)
    picture = Image.frombytes("RGB", (side, side), bytes(rng.getrandbits(8)
                                                         for _ in range(side * side * 3)))
    out = io.BytesIO()
    picture.save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def server(make_server: Any, stand_in: Any) -> Any:
    return make_server(executor=stand_in(0.005), max_running=2,
                       web={"default_max_tokens": 8, "chat_image_bytes": 40_000,
                            "chat_conversation_image_bytes": 100_000})


def client(server: Any) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30, headers=HTMX)


def finished(server: Any, waiter: Any, cid: int) -> None:
    store = server.services.store
    waiter(lambda: store.messages(cid)[-1].status != "streaming", 30, message="the reply")


def new_chat(c: httpx.Client, files: list[tuple[str, tuple[str, bytes, str]]],
             content: str = "What is in it?") -> httpx.Response:
    return c.post("/c", data={"content": content}, files=files)


def test_a_picture_is_stored_served_and_kept_from_a_text_only_model(
        server: Any, waiter: Any, idle_check: Any) -> None:
    store = server.services.store
    first, second = png(seed=1), png(80, 40, seed=2)
    with client(server) as c:
        created = new_chat(c, [("images", ("a.png", first, "image/png")),
                               ("images", ("b.png", second, "image/png"))])
        assert created.status_code == 201, created.text
        cid = int(created.headers["hx-redirect"].rsplit("/", 1)[1])
        finished(server, waiter, cid)
        question, reply = store.messages(cid)
        pictures = store.images(cid)[question.id]
        assert [(p.media_type, p.width, p.height) for p in pictures] == [
            ("image/png", 64, 48), ("image/png", 80, 40)]
        # the text-only model read the words only, and the reply says so in plain words
        assert reply.note is not None and "cannot take images" in reply.note
        assert "2 pictures were not sent" in reply.note
        assert "no model this server serves takes images" in reply.note
        assert reply.prompt_tokens is not None and reply.prompt_tokens < 60
        # served from the store: the file as sent, and a thumbnail
        url = f"/c/{cid}/images/{pictures[0].id}"
        got = c.get(url)
        assert got.status_code == 200 and got.content == first
        assert got.headers["content-type"] == "image/png"
        assert got.headers["cache-control"].startswith("private")
        thumb = c.get(url, params={"thumb": "true"})
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
        assert Image.open(io.BytesIO(thumb.content)).size == (64, 48)
        # the conversation's page shows the thumbnails with their large view
        page = c.get(f"/c/{cid}", headers={"HX-Request": ""}).text
        assert f'href="{url}"' in page and f'src="{url}?thumb=true"' in page
        assert 'data-sees-images="0"' in page
        # a picture of another conversation is not found through this one
        other = c.post("/c", data={"content": "hello"})
        oid = int(other.headers["hx-redirect"].rsplit("/", 1)[1])
        finished(server, waiter, oid)
        assert c.get(f"/c/{oid}/images/{pictures[0].id}").status_code == 404
        assert c.get(f"/c/{cid}/images/999999").status_code == 404
        # a picture alone is a message too
        alone = c.post(f"/c/{cid}/messages", data={"content": "  "},
                       files=[("images", ("c.png", png(seed=3), "image/png"))])
        assert alone.status_code == 200, alone.text
        finished(server, waiter, cid)
        assert len(store.images(cid)) == 2
        # deleted with the conversation
        assert c.delete(f"/c/{cid}").status_code == 200
        assert store.image(pictures[0].id) is None and store.image_bytes(cid) == 0
    idle_check(server.engine)


@pytest.mark.parametrize(("files", "status", "words"), [
    ([("notes.txt", b"just some words", "image/png")], 400, "not a picture"),
    ([("fake.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "image/png")], 400, "not a picture"),
    ([("cut.png", png()[:120], "image/png")], 400, "damaged"),
    ([("big.png", noise_png(130), "image/png")], 413, "is 51 kB; pictures may be at most 40 kB"),
    ([(f"{i}.png", png(8, 8, seed=i), "image/png") for i in range(IMAGES_PER_MESSAGE + 1)],
     400, f"at most {IMAGES_PER_MESSAGE}"),
])
def test_a_bad_upload_is_a_clear_4xx_and_nothing_is_stored(
        server: Any, waiter: Any, files: list[tuple[str, bytes, str]], status: int,
        words: str) -> None:
    store = server.services.store
    with client(server) as c:
        created = c.post("/c", data={"content": "a first message"})
        cid = int(created.headers["hx-redirect"].rsplit("/", 1)[1])
        finished(server, waiter, cid)
        before = store.messages(cid)
        refused = c.post(f"/c/{cid}/messages", data={"content": "keep me"},
                         files=[("images", f) for f in files])
        assert refused.status_code == status, refused.text
        assert refused.headers["hx-retarget"] == "#notice"
        assert words in refused.text, refused.text
        assert store.messages(cid) == before and store.images(cid) == {}
        # a new chat refused the same way leaves no conversation behind
        count = len(store.conversations("local"))
        assert new_chat(c, [("images", f) for f in files]).status_code == status
        assert len(store.conversations("local")) == count


def test_the_conversation_limit_counts_every_picture_it_holds(server: Any,
                                                              waiter: Any) -> None:
    store = server.services.store
    picture = noise_png(100)  # about 30 kB: three fit the conversation's 100 kB, four do not
    assert 25_000 < len(picture) < 34_000
    with client(server) as c:
        created = new_chat(c, [("images", ("1.png", picture, "image/png"))])
        cid = int(created.headers["hx-redirect"].rsplit("/", 1)[1])
        for _ in range(2):
            finished(server, waiter, cid)
            sent = c.post(f"/c/{cid}/messages", data={"content": "more"},
                          files=[("images", ("n.png", picture, "image/png"))])
            assert sent.status_code == 200, sent.text
        finished(server, waiter, cid)
        over = c.post(f"/c/{cid}/messages", data={"content": "one more"},
                      files=[("images", ("n.png", picture, "image/png"))])
        assert over.status_code == 413 and "start a new chat" in over.text
        assert store.image_bytes(cid) == 3 * len(picture)


def test_export_and_import_carry_the_pictures(server: Any, waiter: Any) -> None:
    store = server.services.store
    picture = png(seed=7)
    with client(server) as c:
        created = new_chat(c, [("images", ("x.png", picture, "image/png"))])
        cid = int(created.headers["hx-redirect"].rsplit("/", 1)[1])
        finished(server, waiter, cid)
        exported = c.get(f"/c/{cid}/export.json").json()
        first = exported["messages"][0]
        assert first["images"] == [{"media_type": "image/png",
                                    "data": base64.b64encode(picture).decode()}]
        assert "*(picture: image/png, 64x48" in c.get(f"/c/{cid}/export.md").text
        imported = c.post("/import", files={"file": ("c.json", json.dumps(exported))})
        assert imported.status_code == 201, imported.text
        copy = int(imported.headers["hx-redirect"].rsplit("/", 1)[1])
        question = store.messages(copy)[0]
        (kept,) = store.images(copy)[question.id]
        assert store.image_data(kept.id) == picture and (kept.width, kept.height) == (64, 48)
        again = c.get(f"/c/{copy}/export.json").json()
        assert again["messages"][0]["images"] == first["images"]
        # a bad picture in a file is a 400 naming it, and nothing is imported
        count = len(store.conversations("local"))
        for bad, words in [("not base64!", "messages[0].images[0].data is not base64"),
                           (base64.b64encode(b"plain text").decode(),
                            "messages[0].images[0]")]:
            first["images"] = [{"media_type": "image/png", "data": bad}]
            refused = c.post("/import", files={"file": ("c.json", json.dumps(exported))})
            assert refused.status_code == 400 and words in refused.text, refused.text
        exported["messages"][1]["images"] = [{"data": base64.b64encode(picture).decode()}]
        refused = c.post("/import", files={"file": ("c.json", json.dumps(exported))})
        assert refused.status_code == 400 and "messages[1].images" in refused.text
        assert len(store.conversations("local")) == count


def test_the_csp_lets_pictures_show_from_ferry_and_data_urls_only(server: Any) -> None:
    with client(server) as c:
        csp = c.get("/", headers={"HX-Request": ""}).headers["content-security-policy"]
    rules = dict(rule.strip().split(" ", 1) for rule in csp.split(";"))
    assert rules["img-src"] == "'self' data:"  # no blob:, no other site
    assert rules["default-src"] == "'self'" and rules["script-src"] == "'self'"
    assert rules["object-src"] == "'none'"


def test_shared_mode_keeps_each_users_pictures_their_own(make_shared_server: Any,
                                                        waiter: Any) -> None:
    server, tokens = make_shared_server("shared-pictures", {"bob": False, "cat": False},
                                        web={"default_max_tokens": 8})
    store = server.services.store

    def as_user(name: str) -> httpx.Client:
        return httpx.Client(base_url=server.url, timeout=30,
                            headers={"Authorization": f"Bearer {tokens[name]}"})
    picture = png(seed=11)
    with as_user("bob") as bob, as_user("cat") as cat:
        created = bob.post("/c", data={"content": "mine"},
                           files=[("images", ("p.png", picture, "image/png"))])
        assert created.status_code == 303, created.text
        cid = int(created.headers["location"].rsplit("/", 1)[1])
        finished(server, waiter, cid)
        (image,) = store.images(cid)[store.messages(cid)[0].id]
        url = f"/c/{cid}/images/{image.id}"
        assert bob.get(url).content == picture
        assert cat.get(url).status_code == 404
        assert cat.get(url, params={"thumb": "true"}).status_code == 404
        # nor through a conversation of cat's own
        own = cat.post("/c", data={"content": "cat's"})
        oid = int(own.headers["location"].rsplit("/", 1)[1])
        finished(server, waiter, oid)
        assert cat.get(f"/c/{oid}/images/{image.id}").status_code == 404


def test_a_signed_in_form_carries_a_picture_larger_than_a_plain_body(
        make_shared_server: Any, waiter: Any) -> None:
    """Without script the composer posts its CSRF token in the multipart body, which is
    read before the route: a picture above max_body_bytes still gets through."""
    import os
    import re

    server, tokens = make_shared_server("shared-form", {"dan": False},
                                        web={"default_max_tokens": 8,
                                             "max_body_bytes": 64 * 1024})
    picture = Image.frombytes("RGB", (200, 200), os.urandom(200 * 200 * 3))
    out = io.BytesIO()
    picture.save(out, "PNG")
    assert len(out.getvalue()) > 64 * 1024

    def csrf(page: str) -> str:
        found = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert found is not None
        return found.group(1)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        signed = c.post("/login", data={"token": tokens["dan"], "next": "/"})
        assert signed.status_code == 303, signed.text
        created = c.post("/c", data={"content": "big one", "csrf_token": csrf(c.get("/").text)},
                         files=[("images", ("big.png", out.getvalue(), "image/png"))])
        assert created.status_code == 303, created.text
        cid = int(created.headers["location"].rsplit("/", 1)[1])
        finished(server, waiter, cid)
        (image,) = server.services.store.images(cid)[server.services.store.messages(cid)[0].id]
        assert image.size == len(out.getvalue())
        # the token is still checked: without it the same form is refused
        refused = c.post(f"/c/{cid}/messages", data={"content": "again"},
                         files=[("images", ("big.png", out.getvalue(), "image/png"))])
        assert refused.status_code == 403
