"""Model output reaches HTML only through web.pages.markdown (raw HTML disabled) or escaping."""
from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from markupsafe import Markup

from web.pages import markdown as markdown_module
from web.pages import rendered
from web.pages.markdown import HIGHLIGHT_LIMIT, MARKDOWN_LIMIT, highlight_css, render
from web.sse import text_event


def test_raw_html_in_output_is_escaped() -> None:
    html = render("Hi <script>alert('x')</script> and <img src=x onerror=alert(1)>")
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_markdown_is_rendered() -> None:
    html = render("**bold** and `code`\n\n```python\nprint('<b>')\n```\n\n"
                  "| a | b |\n|---|---|\n| 1 | 2 |")
    assert "<strong>bold</strong>" in html and "<code>code</code>" in html
    # highlighted by Pygments on the server, still escaped
    assert "<code class=\"language-python\"><span class=\"nb\">print</span>" in html
    assert "<span class=\"s1\">'&lt;b&gt;'</span>" in html and "<b>" not in html
    assert "<table>" in html


def test_dangerous_links_are_not_links() -> None:
    html = render("[a](javascript:alert(1)) [b](https://example.org)")
    assert 'href="javascript' not in html
    assert 'href="https://example.org" rel="noopener noreferrer nofollow"' in html


def test_streamed_text_is_escaped() -> None:
    event = text_event("token", "<script>x</script> & more")
    assert event.data == "&lt;script&gt;x&lt;/script&gt; &amp; more"


def test_code_blocks_get_copy_buttons_and_hostile_languages_stay_text() -> None:
    html = render('```"><script>x</script>\n<i>hi</i>\n```\n\n```python\nx = 1\n```')
    assert "<script" not in html and "<i>" not in html
    assert html.count('class="copy-code') == 2
    assert "&lt;i&gt;hi&lt;/i&gt;" in html


def test_app_css_holds_the_code_colours_highlight_css_writes() -> None:
    css = (Path(__file__).parents[3] / "web" / "static" / "app.css").read_text()
    assert highlight_css() in css
    assert ".code pre .k " not in css  # each token class once: .k shares a rule with .kd ...
    assert ".code pre :is(.k, .kd, .kn, .kr) { color: light-dark(#008000, #FF7B72)" in css


def test_a_message_past_the_limit_is_escaped_text() -> None:
    long = "**not bold** <b>x</b>\n" * (MARKDOWN_LIMIT // 20)
    html = render(long)
    assert html.startswith('<p class="as-text">') and "<strong>" not in html and "<b>" not in html
    assert "**not bold** &lt;b&gt;x&lt;/b&gt;" in html
    assert "<strong>" in render(long[:MARKDOWN_LIMIT - 100])


def test_a_code_block_past_the_limit_is_escaped_not_highlighted() -> None:
    code = "print('<b>')\n" * (HIGHLIGHT_LIMIT // 13 + 1)
    html = render(f"```python\n{code}```")
    assert '<code class="language-python">print(&#39;&lt;b&gt;&#39;)' in html
    assert '<span class="nb">' not in html and "Copy" in html
    assert '<span class="nb">print</span>' in render("```python\nprint('<b>')\n```")


@pytest.mark.parametrize("text", ["[" * MARKDOWN_LIMIT, "![[]()" * (MARKDOWN_LIMIT // 6),
                                  "*a" * (MARKDOWN_LIMIT // 2), "<" * MARKDOWN_LIMIT])
def test_the_costliest_messages_under_the_limit_stay_bounded(text: str) -> None:
    """One `[` after another was ~65 us each with js-default's nesting of 100; a message at
    the limit renders in about 0.6 s on a busy 2-core machine (bound: 5 s)."""
    started = time.perf_counter()
    render(text)
    assert time.perf_counter() - started < 5


def test_render_ahead_renders_in_the_worker_process_and_caches() -> None:
    text = "# A heading\n\n```python\nx = 1\n```\n" + uuid.uuid4().hex  # not cached yet
    calls: list[str] = []
    original = markdown_module.render

    def spy(source: str) -> Markup:
        calls.append(source)
        return original(source)

    markdown_module.render = spy  # type: ignore[assignment]
    try:
        asyncio.run(rendered.render_ahead([text, text, None, ""]))
        html = rendered.markdown(text)  # from the cache: not rendered here
        assert calls == []
    finally:
        markdown_module.render = original  # type: ignore[assignment]
    assert html == render(text) and isinstance(html, Markup)
    assert '<h1>A heading</h1>' in html and '<span class="n">x</span>' in html


def test_viewers_of_one_text_share_its_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three tabs opening one long conversation at once render it once, not three times."""
    text = "## Shared\n\n" + uuid.uuid4().hex
    sent: list[list[str]] = []
    original = rendered._render_into_cache

    async def counting(todo: list[str]) -> None:
        sent.append(list(todo))
        await original(todo)

    monkeypatch.setattr(rendered, "_render_into_cache", counting)

    async def three_viewers() -> None:
        await asyncio.gather(*(rendered.render_ahead([text, "x " + text if i else None])
                               for i in range(3)))

    asyncio.run(three_viewers())
    assert sorted(t for batch in sent for t in batch) == sorted([text, "x " + text])
    assert rendered.markdown(text) == render(text) and not rendered._rendering


def test_a_viewer_left_alone_renders_what_the_other_did_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The viewer whose render another was waiting for leaves (its request is cancelled):
    the one still waiting renders the text itself, in the worker."""
    text = "## Left\n\n" + uuid.uuid4().hex
    original = rendered._render_into_cache

    async def slow_first(todo: list[str]) -> None:
        if not calls:
            calls.append(todo)
            await asyncio.sleep(30)  # cancelled before it renders
        calls.append(todo)
        await original(todo)

    calls: list[list[str]] = []
    monkeypatch.setattr(rendered, "_render_into_cache", slow_first)

    async def run() -> None:
        first = asyncio.create_task(rendered.render_ahead([text]))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(rendered.render_ahead([text]))
        await asyncio.sleep(0.05)
        first.cancel()
        await asyncio.wait_for(second, 60)

    asyncio.run(run())
    assert calls == [[text], [text]] and not rendered._rendering
    assert rendered.markdown(text) == render(text)
