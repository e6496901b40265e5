"""Model output reaches HTML only through web.pages.markdown (raw HTML disabled) or escaping."""
from __future__ import annotations

from pathlib import Path

from web.pages.markdown import highlight_css, render
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
