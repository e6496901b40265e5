"""Model output as safe HTML: Markdown with raw HTML disabled, so tags in the text are escaped.

Fenced code is highlighted on the server with Pygments (its HTML formatter escapes the
code) and framed with its language and a Copy button; no script or stylesheet from a CDN.
"""
from __future__ import annotations

from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# "js-default": CommonMark plus tables and strikethrough, html=False (raw HTML is escaped),
# and markdown-it's link check refuses javascript:, vbscript:, file: and non-image data: URLs.
_md = MarkdownIt("js-default", {"breaks": True})
_formatter = HtmlFormatter(nowrap=True)  # spans with class names; app.css colours them
COPY = ('<button type="button" class="copy-code small-button" title="Copy the code">'
        'Copy</button>')


def _link_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
    tokens[idx].attrSet("target", "_blank")
    html: str = renderer.renderToken(tokens, idx, options, env)
    return html


def code_html(code: str, lang: str) -> str:
    """Highlighted (or, for an unknown language, escaped) code lines."""
    if lang:
        try:
            lexer = get_lexer_by_name(lang, stripnl=False, ensurenl=False)
        except ClassNotFound:
            pass
        else:
            return str(highlight(code, lexer, _formatter))
    return str(escape(code))


def _fence(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    lang = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
    cls = f' class="language-{escape(lang)}"' if lang else ""
    label = f'<span class="code-lang">{escape(lang)}</span>' if lang else "<span></span>"
    return (f'<div class="code">\n<div class="code-head">{label}{COPY}</div>'
            f'<pre class="highlight"><code{cls}>{code_html(token.content, lang)}</code></pre>'
            '</div>\n')


_md.add_render_rule("link_open", _link_open)
_md.add_render_rule("fence", _fence)
_md.add_render_rule("code_block", _fence)


def render(text: str) -> Markup:
    """Markdown source -> HTML that is safe to put in a page."""
    return Markup(_md.render(text))


def highlight_css(selector: str, style: str) -> str:
    """The colours of one Pygments style under `selector` (used to build app.css)."""
    return str(HtmlFormatter(style=style).get_style_defs(selector))
