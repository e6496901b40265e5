"""Pictures in the chat in headless Chromium against the real server and model: attach by
the button (mouse or keyboard), paste and drop, previews that can be removed, a text-only
model's plain words, the stored thumbnail after a reload and its large view, a bad file
refused with the message and its pictures kept in the composer; the tiny LLaVA reading a
picture with its reply streamed, and picked while a picture waits.

The screenshot goes to docs/screenshots/chat-images.png when FERRY_UPDATE_SCREENSHOTS=1 is
set or the file is missing."""
from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from tests.tools.screenshots import screenshot_path
from tests.tools.tiny_llava import build, chat_server, content, vision_set

pytestmark = [pytest.mark.model, pytest.mark.browser]


def harbour(width: int = 480, height: int = 320) -> bytes:
    """A small drawn picture: sky, sun, sea and a boat."""
    picture = Image.new("RGB", (width, height))
    draw = ImageDraw.Draw(picture)
    for y in range(height):
        sky = y < height * 0.6
        t = y / height
        draw.line([(0, y), (width, y)], fill=(int(250 - 90 * t), int(170 + 40 * t), 120 + int(
            100 * t)) if sky else (30, int(90 + 60 * t), int(150 + 50 * t)))
    draw.ellipse([width * 0.62, height * 0.18, width * 0.78, height * 0.42], fill=(255, 226, 120))
    draw.polygon([(150, 215), (290, 215), (268, 245), (172, 245)], fill=(120, 60, 40))
    draw.polygon([(215, 120), (215, 210), (270, 210)], fill=(245, 245, 240))
    out = io.BytesIO()
    picture.save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(web={"default_max_tokens": 40, "chat_temperature": 0.0})


@pytest.fixture
def page(browser: Any, csp_page: Any) -> Iterator[Any]:
    with csp_page(browser) as page:
        yield page


def previews(page: Any) -> Any:
    return page.locator("#composer .attach-tray .preview")


def loaded(page: Any, selector: str) -> bool:
    """Every picture under `selector` decoded (the CSP let it in)."""
    return bool(page.eval_on_selector_all(
        selector, "els => els.length > 0 && els.every(i => i.complete && i.naturalWidth > 0)"))


def test_attach_send_to_a_text_only_model_reload_and_view(server: Any, page: Any, waiter: Any,
                                                          idle_check: Any,
                                                          tmp_path: Path) -> None:
    store = server.services.store
    picture = harbour()
    page.goto(server.url + "/")
    page.set_input_files("#composer input[data-attach]", files=[
        {"name": "harbour.png", "mimeType": "image/png", "buffer": picture}])
    waiter(lambda: loaded(page, "#composer .attach-tray .preview img"), 10,
           message="the composer's preview")
    warn = page.locator("#composer .attach-warn")
    assert warn.is_visible() and "cannot take images" in warn.inner_text()
    assert "No model this server serves takes images" in warn.inner_text()
    page.fill("#composer textarea", "What do you see in this picture?")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    cid = int(page.url.rsplit("/", 1)[1])
    page.locator("article.msg.assistant.complete").wait_for()
    note = page.inner_text("article.msg.assistant .note")
    assert "cannot take images" in note and "your picture was not sent" in note
    question = store.messages(cid)[0]
    (stored,) = store.images(cid)[question.id]
    assert store.image_data(stored.id) == picture
    # after a reload the picture shows from the store, and opens large
    page.reload()
    thumbs = "article.msg.user .attachments img"
    waiter(lambda: loaded(page, thumbs), 10, message="the stored thumbnail")
    assert previews(page).count() == 0 and not page.locator("#composer .attach-warn").is_visible()
    page.click(thumbs)
    page.locator("dialog.lightbox[open]").wait_for()
    waiter(lambda: loaded(page, "dialog.lightbox img"), 10, message="the large view")
    assert page.eval_on_selector("dialog.lightbox img", "i => i.naturalWidth") == 480
    page.keyboard.press("Escape")
    page.wait_for_selector("dialog.lightbox", state="hidden")
    # the README's picture: the stored thumbnail, the model's words, one more attached
    page.set_input_files("#composer input[data-attach]", files=[
        {"name": "boat.png", "mimeType": "image/png", "buffer": harbour(240, 160)}])
    waiter(lambda: loaded(page, "#composer .attach-tray .preview img"), 10,
           message="the composer's preview")
    page.fill("#composer textarea", "And in this one?")
    page.mouse.move(0, 0)
    page.screenshot(path=str(screenshot_path("chat-images.png", tmp_path)))
    idle_check(server.engine)


ADD_BY_EVENT = """([kind, data]) => {
  const bytes = Uint8Array.from(atob(data), c => c.charCodeAt(0));
  const moved = new DataTransfer();
  moved.items.add(new File([bytes], kind + ".png", {type: "image/png"}));
  const area = document.querySelector("#composer textarea");
  if (kind === "pasted") {
    area.dispatchEvent(new ClipboardEvent("paste", {clipboardData: moved, bubbles: true,
                                                    cancelable: true}));
  } else {
    for (const name of ["dragover", "drop"]) {
      area.dispatchEvent(new DragEvent(name, {dataTransfer: moved, bubbles: true,
                                              cancelable: true}));
    }
  }
}"""


def test_paste_drop_remove_and_a_bad_file_keeps_the_message(server: Any, page: Any,
                                                            waiter: Any) -> None:
    store = server.services.store
    data = base64.b64encode(harbour(96, 64)).decode()
    page.goto(server.url + "/")
    page.evaluate(ADD_BY_EVENT, ["pasted", data])
    page.evaluate(ADD_BY_EVENT, ["dropped", data])
    waiter(lambda: previews(page).count() == 2 and
           loaded(page, "#composer .attach-tray .preview img"), 10, message="two previews")
    assert page.eval_on_selector("#composer input[data-attach]",
                                 "i => [...i.files].map(f => f.name)") == ["pasted.png",
                                                                          "dropped.png"]
    page.click("#composer .attach-tray .preview:first-child .remove")
    waiter(lambda: previews(page).count() == 1, 10, message="one preview left")
    assert page.eval_on_selector("#composer input[data-attach]",
                                 "i => [...i.files].map(f => f.name)") == ["dropped.png"]
    # a file that is no picture (picked from the keyboard's paperclip): refused in plain
    # words, the text and pictures stay
    with page.expect_file_chooser() as chooser:
        page.focus("#composer label.attach")
        page.keyboard.press("Enter")
    chooser.value.set_files(files=[
        {"name": "notes.png", "mimeType": "image/png", "buffer": b"just some words"}])
    waiter(lambda: previews(page).count() == 2, 10, message="the bad file's preview")
    count = len(store.conversations("local"))
    page.fill("#composer textarea", "Keep this question")
    page.keyboard.press("Enter")
    page.locator("#notice .notice").wait_for()
    assert "“notes.png” is not a picture" in page.inner_text("#notice")
    assert page.input_value("#composer textarea") == "Keep this question"
    assert previews(page).count() == 2 and len(store.conversations("local")) == count
    page.click("#composer .attach-tray .preview:last-child .remove")
    page.focus("#composer textarea")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    cid = int(page.url.rsplit("/", 1)[1])
    page.locator("article.msg.user .attachments img").wait_for()
    assert [len(v) for v in store.images(cid).values()] == [1]
    page.locator("article.msg.assistant.complete").wait_for()


@pytest.fixture(scope="module")
def llava(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("browser-llava")
    build(folder, tokenizer)
    return folder


def test_a_vision_model_reads_the_picture_and_the_reply_streams(
        make_server: Any, llava: Path, page: Any, waiter: Any, idle_check: Any) -> None:
    """The tiny LLaVA served for real: no warning in the message box, the reply streams and
    is the API's for the same message and picture, and the thumbnail stays after a
    reload."""
    import httpx

    server = chat_server(make_server, llava, default_max_tokens=12, chat_temperature=0.0,
                         chat_ignore_eos=True)
    store = server.services.store
    picture = harbour(96, 64)
    page.goto(server.url + "/")
    assert page.get_attribute("#composer", "data-sees-images") == "1"
    page.set_input_files("#composer input[data-attach]", files=[
        {"name": "harbour.png", "mimeType": "image/png", "buffer": picture}])
    waiter(lambda: loaded(page, "#composer .attach-tray .preview img"), 10,
           message="the composer's preview")
    assert not page.locator("#composer .attach-warn").is_visible()
    page.fill("#composer textarea", "What do you see?")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    cid = int(page.url.rsplit("/", 1)[1])
    waiter(lambda: loaded(page, "article.msg.user .attachments img"), 10,
           message="the sent message's thumbnail")
    page.locator("article.msg.assistant.complete").wait_for()
    question, reply = store.messages(cid)
    assert reply.note is None and reply.completion_tokens == 12
    want = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": content("What do you see?", [picture])}]})
    assert want.json()["choices"][0]["message"]["content"] == reply.content
    assert page.inner_text("article.msg.assistant .body").strip() == reply.content.strip()
    page.reload()
    waiter(lambda: loaded(page, "article.msg.user .attachments img"), 10,
           message="the stored thumbnail")
    (stored,) = store.images(cid)[question.id]
    assert store.image_data(stored.id) == picture
    idle_check(server.engine)


@pytest.fixture(scope="module")
def seer(in_thread_server: Any, model_dir: Path, llava: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    running = vision_set(in_thread_server, model_dir, llava, tmp_path_factory.mktemp("data"),
                         tmp_path_factory.mktemp("cache"), default_max_tokens=8)
    yield running
    running.stop()


def test_picking_a_model_that_takes_images_keeps_the_attached_pictures(
        seer: Any, page: Any, waiter: Any) -> None:
    """A text model and the tiny LLaVA in one server: the warning names the vision model,
    and picking it while a picture waits keeps the picture and the page."""
    server = seer
    store = server.services.store
    page.goto(server.url + "/")
    page.fill("#composer textarea", "Hello")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    cid = int(page.url.rsplit("/", 1)[1])
    page.locator("article.msg.assistant.complete").wait_for()
    page.set_input_files("#composer input[data-attach]", files=[
        {"name": "harbour.png", "mimeType": "image/png", "buffer": harbour(96, 64)}])
    warn = page.locator("#composer .attach-warn")
    warn.wait_for()
    assert "Models here that can: tiny-llava" in warn.inner_text()
    page.evaluate("window.__samePage = true")
    page.select_option("form.model-pick select", "tiny-llava")
    waiter(lambda: (c := store.conversation(cid)) is not None and c.model == "tiny-llava", 10,
           message="the conversation's model saved")
    page.wait_for_selector("#composer .attach-warn", state="hidden")
    assert page.evaluate("window.__samePage === true")  # no reload: the picture waits
    assert previews(page).count() == 1
    assert page.get_attribute("#composer", "data-sees-images") == "1"
    # sent: the vision model loads and reads it; the text model's earlier reply stays
    page.keyboard.press("Enter")
    waiter(lambda: len(store.messages(cid)) == 4 and store.messages(cid)[-1].status
           != "streaming", 60, message="the vision model's reply")
    last = store.messages(cid)[-1]
    assert last.status == "complete" and last.note is None and last.model == "tiny-llava"
    assert server.engine.table.wait_idle(30)
