"""Model output as safe HTML: Markdown with raw HTML disabled, so tags in the text are escaped."""
from __future__ import annotations

from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup

# "js-default": CommonMark plus tables and strikethrough, html=False (raw HTML is escaped),
# and markdown-it's link check refuses javascript:, vbscript:, file: and non-image data: URLs.
_md = MarkdownIt("js-default", {"breaks": True})


def _link_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
    tokens[idx].attrSet("target", "_blank")
    return renderer.renderToken(tokens, idx, options, env)


_md.add_render_rule("link_open", _link_open)


def render(text: str) -> Markup:
    """Markdown source -> HTML that is safe to put in a page."""
    return Markup(_md.render(text))
