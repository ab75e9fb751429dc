"""Numbered figures, numbered equations and a linked bibliography for the site's pages.

``references(body)``: the papers a page's prose uses (Mamba, Mamba-2, Mamba-3, Blelloch's scan,
Hillis and Steele's scan; a paper is listed only where the page names it), numbered in the order
the page first names them: the first mention in the prose (never inside code, printed output, a
heading or a link) gets a link ``[n]`` to the entry, and a "References" section with each entry
and its link ends the page. ``number_figures(body)``: every figure a cell drew gets a caption,
"Figure n. <its alt text>", and an anchor ``#figure-n``. Equations are numbered by MathJax
(``EQUATIONS``, a configuration the site's template adds: every displayed formula, ``(1)``,
``(2)``, … per page).
"""

import html
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    key: str
    mention: str  # a regular expression for the words that name it in prose
    entry: str  # the bibliography entry, HTML
    url: str


REFERENCES = [
    Reference("mamba", r"\bMamba(?:-1)?\b(?![-‑]\d)",
              "Albert Gu and Tri Dao. <i>Mamba: Linear-Time Sequence Modeling with Selective State "
              "Spaces</i>. arXiv:2312.00752, 2023.", "https://arxiv.org/abs/2312.00752"),
    Reference("mamba2", r"\bMamba-2\b",
              "Tri Dao and Albert Gu. <i>Transformers are SSMs: Generalized Models and Efficient "
              "Algorithms Through Structured State Space Duality</i>. ICML 2024; "
              "arXiv:2405.21060.", "https://arxiv.org/abs/2405.21060"),
    Reference("mamba3", r"\bMamba-3\b",
              "Aakash Lahoti, Kevin Y. Li, Berlin Chen, Caitlin Wang, Aviv Bick, J. Zico Kolter, "
              "Tri Dao, Albert Gu. <i>Mamba-3: Improved Sequence Modeling using State Space "
              "Principles</i>. ICLR 2026, arXiv:2603.15569.",
              "https://arxiv.org/abs/2603.15569"),
    Reference("blelloch", r"\bBlelloch(?:'s)?\b",
              "Guy E. Blelloch. <i>Prefix Sums and Their Applications</i>. Technical Report "
              "CMU-CS-90-190, Carnegie Mellon University, 1990.",
              "http://www.cs.cmu.edu/afs/cs.cmu.edu/project/scandal/public/papers/CMU-CS-90-190.html"),
    Reference("hillis-steele", r"\bHillis[–-]Steele\b",
              "W. Daniel Hillis and Guy L. Steele Jr. <i>Data Parallel Algorithms</i>. "
              "Communications of the ACM 29(12), 1170–1183, 1986.",
              "https://doi.org/10.1145/7902.7903"),
]
# MathJax 2: number every displayed formula (nbconvert's own setting numbers only the AMS
# environments); run after nbconvert's configuration, so this one wins
EQUATIONS = """<script type="text/x-mathjax-config">
MathJax.Hub.Config({TeX: {equationNumbers: {autoNumber: "all"}}});
</script>"""
SKIP = {"code", "pre", "a", "h1", "h2", "h3", "h4", "h5", "h6", "script", "style", "textarea",
        "summary", "footer", "nav", "title"}
TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)\b[^>]*?(/?)>")
VOID = {"br", "img", "hr", "input", "meta", "link", "wbr", "source", "col", "area", "base"}


def _prose(body):
    """Split ``body`` into (text, in_prose) pieces: the text between tags, and whether it lies in
    a markdown cell's rendered prose, outside every tag of ``SKIP``."""
    pieces, stack, at = [], [], 0  # stack: (tag name, opens rendered markdown)
    for m in TAG.finditer(body):
        prose = (any(md for _, md in stack) and not any(name in SKIP for name, _ in stack))
        pieces += [(body[at:m.start()], prose), (m.group(0), False)]
        closing, name, selfclosing = m.group(1), m.group(2).lower(), m.group(3)
        if closing:
            while stack and stack.pop()[0] != name:
                pass
        elif name not in VOID and not selfclosing:
            stack.append((name, name == "div" and "jp-RenderedMarkdown" in m.group(0)))
        at = m.end()
    pieces.append((body[at:], False))
    return pieces


def references(body, refs=REFERENCES):
    """``body`` with the first prose mention of each paper linked to its numbered entry, and the
    "References" section (before the page's footer); unchanged where the prose names none."""
    pieces, cited = _prose(body), []
    for k, (text, prose) in enumerate(pieces):
        if not prose:
            continue
        for ref in refs:
            if ref in cited:
                continue
            m = re.search(ref.mention, text)
            if m:
                cited.append(ref)
                n = len(cited)
                link = f'<a class="ml-ref" href="#ref-{ref.key}">[{n}]</a>'
                text = text[:m.end()] + link + text[m.end():]
        pieces[k] = (text, prose)
    out = "".join(t for t, _ in pieces)
    if not cited:
        return out
    items = "".join(f'<li id="ref-{r.key}">{r.entry} <a href="{html.escape(r.url)}">'
                    f"{html.escape(r.url)}</a></li>" for r in cited)
    # (the heading has no id: the page's outline and its scroll tracking list the chapter's own
    # sections only)
    section = (f'<section class="ml-references" id="references"><h2>References</h2>'
               f"<ol>{items}</ol></section>")
    at = out.find('<footer class="ml-footer">')
    at = at if at >= 0 else out.rfind("</main>")
    return out[:at] + section + out[at:] if at >= 0 else out + section


FIGURE = re.compile(r'(<div class="jp-RenderedImage[^"]*"[^>]*>\s*<img\b([^>]*)>\s*</div>)')
ALT = re.compile(r'\balt="([^"]*)"')


def number_figures(body):
    """Every figure of a cell's output captioned "Figure n. <alt text>" with anchor
    ``#figure-n``, numbered down the page."""
    count = 0

    def caption(m):
        nonlocal count
        count += 1
        alt = ALT.search(m.group(2))
        words = f" {alt.group(1)}" if alt and alt.group(1) else ""
        return (f'{m.group(1)}<p class="ml-figcap" id="figure-{count}">'
                f"<b>Figure {count}.</b>{words}</p>")

    return FIGURE.sub(caption, body)
