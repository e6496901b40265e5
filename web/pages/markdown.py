"""Model output as safe HTML: Markdown with raw HTML disabled, so tags in the text are escaped.

Fenced code is highlighted on the server with Pygments (its HTML formatter escapes the
code) and framed with its language and a Copy button; no script or stylesheet from a CDN.

Both are pure Python and a reply (or an imported conversation) can be as long as the body
limit, so each message's cost is bounded: past MARKDOWN_LIMIT characters a message is shown
as escaped text, past HIGHLIGHT_LIMIT a code block is not highlighted. web.pages.rendered
runs this on a worker thread and caches it; the bounds cap what one message costs there.
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
# maxNesting 20 (CommonMark preset's value, not js-default's 100): every `[` scans ahead up to
# that many levels for its label, so a message of brackets costs 5x less
_md = MarkdownIt("js-default", {"breaks": True, "maxNesting": 20})
MARKDOWN_LIMIT = 32 * 1024  # characters; worst inputs (all `[`) take ~0.6 s, prose ~0.1 s
HIGHLIGHT_LIMIT = 16 * 1024  # characters of one code block
_formatter = HtmlFormatter(nowrap=True)  # spans with class names; app.css colours them
COPY = ('<button type="button" class="copy-code small-button" title="Copy the code">'
        'Copy</button>')


def _link_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
    tokens[idx].attrSet("target", "_blank")
    html: str = renderer.renderToken(tokens, idx, options, env)
    return html


def _cell_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    """A table cell's alignment as a class (app.css), not a style attribute: the page's
    Content-Security-Policy allows no inline style."""
    token = tokens[idx]
    style = token.attrGet("style") or ""
    if style.startswith("text-align:"):
        token.attrs.pop("style", None)
        token.attrSet("class", "align-" + style.split(":", 1)[1].strip())
    html: str = renderer.renderToken(tokens, idx, options, env)
    return html


def code_html(code: str, lang: str) -> str:
    """Highlighted (or, for an unknown language, escaped) code lines."""
    if lang and len(code) <= HIGHLIGHT_LIMIT:
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
_md.add_render_rule("th_open", _cell_open)
_md.add_render_rule("td_open", _cell_open)
_md.add_render_rule("code_block", _fence)


def render(text: str) -> Markup:
    """Markdown source -> HTML that is safe to put in a page (escaped text past
    MARKDOWN_LIMIT)."""
    if len(text) > MARKDOWN_LIMIT:
        return Markup(f'<p class="as-text">{escape(text)}</p>\n')
    return Markup(_md.render(text))


def _declarations(style: str) -> dict[str, dict[str, str]]:
    """One Pygments style: token class -> {property: value}, in get_style_defs' order."""
    rules = sorted((level, ttype, cls, css) for cls, (css, ttype, level)
                   in HtmlFormatter(style=style).class2style.items() if css)
    return {cls: dict(d.split(": ", 1) for d in css.split("; ")) for _, _, cls, css in rules}


def _rule(selector: str, classes: list[str], declarations: str) -> str:
    names = ", ".join(f".{c}" for c in classes)
    target = f"{selector} {names}" if len(classes) == 1 else f"{selector} :is({names})"
    return f"{target} {{ {declarations} }}"


def highlight_css(selector: str = ".code pre", light: str = "default",
                  dark: str = "github-dark") -> str:
    """app.css's code colours (a test checks that app.css holds them). Each token class is named
    once, its colour a light-dark() pair as every colour of the page; what only the dark style
    sets (its background and text colour, some weights) goes under :root[data-theme=dark].
    Classes with the same declarations share a rule. Left out: the light style's background
    (the code box has the page's surface) and its red box around lexer errors (the code in a
    reply is often half-written)."""
    lo, hi = _declarations(light), _declarations(dark)
    shared: dict[str, list[str]] = {}
    dark_only: dict[str, list[str]] = {}
    for cls in dict.fromkeys([*lo, *hi]):
        mine, theirs = lo.get(cls, {}), dict(hi.get(cls, {}))
        both = []
        for prop, value in mine.items():
            if prop == "border":
                continue
            other = theirs.pop(prop, value)
            if other == value:
                both.append(f"{prop}: {value}")
            elif value.startswith("#") and other.startswith("#"):
                both.append(f"{prop}: light-dark({value}, {other})")
            else:
                both.append(f"{prop}: {value}")
                theirs[prop] = other
        if both:
            shared.setdefault("; ".join(both), []).append(cls)
        if theirs:
            dark_only.setdefault("; ".join(f"{k}: {v}" for k, v in theirs.items()), []).append(cls)
    # the dark code's own text colour ('' is Pygments' Token.Text): the classes that only set
    # that one inherit it from the pre (Pygments' spans do not nest)
    text = dark_only.pop(f"color: {hi['']['color']}")
    assert "" in text
    on_dark = f":root[data-theme=dark] {selector}"
    background = HtmlFormatter(style=dark).style.background_color
    return "".join([*(_rule(selector, classes, decl) + "\n" for decl, classes in shared.items()),
                    f"{on_dark} {{ background: {background}; color: {hi['']['color']} }}\n",
                    *(_rule(on_dark, classes, decl) + "\n"
                      for decl, classes in dark_only.items())])
