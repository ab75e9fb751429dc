"""Offline decks: reveal.js, MathJax, require.js, jQuery, fonts and the widget manager, all local.

    python -m course.classroom.slides_offline fetch     # npm packages -> build/vendor (once)
    python -m course.classroom.slides_offline pdf slides/01_discretization.slides.html

``fetch`` runs ``npm pack`` for the pinned packages below (the registry's tarballs, checked against
the sha512 recorded here) and unpacks them under ``build/vendor/`` (git-ignored; never committed).
``configure(exporter, out_dir)`` copies the parts a deck loads into ``<out_dir>/vendor/`` and points
nbconvert's SlidesExporter there with relative URLs, so a folder of decks opens from disk with the
network off:

    reveal.js      dist/ (+ theme fonts: Source Sans Pro, League Gothic) and the notes plugin
    MathJax 2      MathJax.js?config=TeX-AMS_CHTML-full,Safe with the TeX input, CommonHTML output
                   and its TeX web fonts (not ``latest.js``, which asks a CDN for a newer version)
    require.js     what nbconvert's reveal template loads reveal.js through
    jQuery         2.x, what the template expects (2.0.3 is not on npm; 2.2.4 is the last 2.x)
    html-manager   ``embed-amd.js`` renders saved widget state; its Font Awesome fonts come along

nbconvert's mermaid.js import (an ES module from a CDN) is left out of offline decks: no chapter
draws mermaid diagrams. Speaker notes (cells of slide_type ``notes``) go to reveal's notes plugin.
``pdf(deck)`` prints a deck through Chromium's print view (reveal's ``?print-pdf``), one page per
slide, after MathJax has typeset.
"""

import base64
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENDOR = Path(os.environ.get("MAMBALEARN_VENDOR", REPO / "build" / "vendor"))
CHROMIUM = os.environ.get("MAMBALEARN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# name: (version, sha512 of the registry tarball, [paths inside the package a deck needs])
PACKAGES = {
    "reveal.js": (
        "4.0.2",
        "LWZSUenufF1gpD7npxJ7KfoQQFKgc1D6XrLTFgKlwWNP1BQ74hT48KONFWMAw+8R/QUeaScCLCLrBVHDfFIEiw==",
        ["dist", "plugin/notes", "LICENSE"]),
    "mathjax": (
        "2.7.7",
        "OOl0B2/0tSJAtAZarXnQuLDBLgTNRqiI9VqHTQzPsxf4okT2iIpDrvaklK9x2QEMD1sDj4yRn11Ygci41DxMAQ==",
        ["MathJax.js", "LICENSE", "config/TeX-AMS_CHTML-full.js", "config/Safe.js", "extensions",
         "jax/input/TeX", "jax/output/CommonHTML", "jax/element", "fonts/HTML-CSS/TeX/woff",
         "fonts/HTML-CSS/TeX/otf", "localization/en"]),
    "requirejs": (
        "2.1.10",
        "4JqdTihK3kOnT387LxCHuJZ/9QsKg2EIl7LmaW35PIyM4LwCI2jwyy4fy6pbY/ZZH2JoY/QEcb5PzULFPP6gcQ==",
        ["require.js"]),
    "jquery": (
        "2.2.4",
        "lBHj60ezci2u1v2FqnZIraShGgEXq35qCzMv4lITyHGppTnA13rwR0MgwyNJh9TnDs3aXUvd1xjAotfraMHX/Q==",
        ["dist/jquery.min.js", "LICENSE.txt"]),
    "@jupyter-widgets/html-manager": (
        "1.0.15",
        "5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        ["dist"]),
    # the web fonts of nbconvert's default reveal theme, "simple" (Google Fonts on the web)
    "@fontsource/lato": (
        "5.3.0",
        "0WhF/4rhrw+ErIyneKvhHn2YAl+xf8GDtllgOgOzDmeaSlLQtjpChXaQOpWhG2BchQW0WJy2zLV12Hdg0ndOMw==",
        ["LICENSE", "files", "400.css", "700.css", "400-italic.css", "700-italic.css"]),
    "@fontsource/news-cycle": (
        "5.3.0",
        "FYR97v6llb/+wXFWW+9AmUPSXE6mrfwOeEDdErh2NH7mKf1dqb7iPJWUTMRtApl09atP6qhD5C8jK6fmb0ydZg==",
        ["LICENSE", "files", "400.css", "700.css"]),
}
SKIP = shutil.ignore_patterns("*.map", "*.esm.js", "embed.js", "libembed-amd.js")
# what the exporter loads, relative to the deck's folder
URLS = {
    "reveal_url_prefix": "vendor/reveal.js",
    "mathjax_url": "vendor/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
    "require_js_url": "vendor/requirejs/require.js",
    "jquery_url": "vendor/jquery/dist/jquery.min.js",
    "widget_renderer_url": "vendor/@jupyter-widgets/html-manager/dist/embed-amd.js",
}
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""
GOOGLE_FONT = re.compile(r"@import url\((['\"]?)https://fonts\.googleapis\.com/css\?family=([^)'\"]+)\1\);?")


def _unpacked(name):
    return VENDOR / "npm" / name


def _stamp():
    return json.dumps({n: v[0] for n, v in PACKAGES.items()}, sort_keys=True)


def fetch(force=False):
    """``npm pack`` every pinned package, check its sha512, unpack it under ``VENDOR/npm``."""
    (VENDOR / "npm").mkdir(parents=True, exist_ok=True)
    with open(VENDOR / "npm.lock", "w") as lock:  # parallel test workers fetch once
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = VENDOR / "npm" / "stamp.json"
        if force or not stamp.exists() or stamp.read_text() != _stamp():
            _fetch()
            stamp.write_text(_stamp())
    return VENDOR / "npm"


def _fetch():
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("offline slides fetch reveal.js, MathJax... from the npm registry: "
                           "install npm (apt-get install -y npm)")
    with tempfile.TemporaryDirectory() as tmp:
        specs = [f"{n}@{v[0]}" for n, v in PACKAGES.items()]
        out = subprocess.run([npm, "pack", *specs, "--json", "--pack-destination", tmp], cwd=tmp,
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"npm pack failed:\n{out.stderr[-2000:]}")
        for info in json.loads(out.stdout):
            version, sha512, _ = PACKAGES[info["name"]]
            tgz = Path(tmp) / info["filename"]
            digest = base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
            if info["version"] != version or digest != sha512:
                raise RuntimeError(f"{info['name']}@{info['version']}: tarball does not match the "
                                   f"pinned sha512 in {__name__}.PACKAGES")
            dest = _unpacked(info["name"])
            shutil.rmtree(dest, ignore_errors=True)
            with tarfile.open(tgz) as tar:  # every npm tarball holds one folder, package/
                members = [m for m in tar.getmembers() if m.name.startswith("package/")
                           and (m.isfile() or m.isdir()) and ".." not in m.name.split("/")]
                for m in members:
                    m.name = m.name.removeprefix("package/")
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(dest, members=[m for m in members if m.name], **safe)


def install(out_dir):
    """Copy what decks load into ``out_dir/vendor`` (once per version); returns that folder."""
    fetch()
    dest = Path(out_dir) / "vendor"
    stamp = dest / "stamp.json"
    if stamp.exists() and stamp.read_text() == _stamp():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name, (_, _, paths) in PACKAGES.items():
        for rel in paths:
            src, dst = _unpacked(name) / rel, dest / name / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=SKIP)
            else:
                shutil.copy2(src, dst)
    for css in (dest / "reveal.js" / "dist" / "theme").glob("*.css"):
        css.write_text(GOOGLE_FONT.sub(lambda m: _local_fonts(m, dest), css.read_text()))
    stamp.write_text(_stamp())
    return dest


def _local_fonts(match, dest):
    """``@import`` of Google Fonts -> the vendored @fontsource files (left as is when not vendored).

    ``family=News+Cycle:400,700`` -> ``../../../@fontsource/news-cycle/{400,700}.css``.
    """
    name, _, weights = match.group(2).partition(":")
    slug = name.replace("+", "-").lower()
    files = [w.replace("italic", "-italic") + ".css" for w in (weights or "400").split(",")]
    if not all((dest / "@fontsource" / slug / f).exists() for f in files):
        return match.group(0)
    return "".join(f"@import url(../../../@fontsource/{slug}/{f});" for f in files)


def configure(exporter, out_dir, template=True):
    """Point a SlidesExporter (or HTMLExporter) at ``out_dir/vendor``; installs it if needed.

    ``template``: also use nbconvert's template without its mermaid.js import (an exporter with
    a template of its own, like the deck's, leaves that out itself).
    """
    from jinja2 import DictLoader

    install(out_dir)
    for trait, url in URLS.items():
        if exporter.has_trait(trait):
            setattr(exporter, trait, url)
    if not template:
        return exporter
    # the same template (reveal's or lab's index.html.j2) without the mermaid.js import
    exporter.extra_loaders = [DictLoader({"mambalearn_offline.html.j2": TEMPLATE})]
    exporter.template_file = "mambalearn_offline.html.j2"
    return exporter


def remote_urls(html):
    """The http(s) URLs a page would load (script/link/img/iframe src and href, CSS @import)."""
    tags = re.findall(r"<(?:script|link|img|iframe|source)\b[^>]*?(?:src|href)\s*=\s*[\"']"
                      r"((?:https?:)?//[^\"']+)", html, re.I)
    imports = re.findall(r"(?:@import\s+(?:url\()?|import\s.*?from\s+)[\"']?"
                         r"((?:https?:)?//[^\"')]+)", html)
    return sorted(set(tags + imports))


def chromium():
    """Path of Debian's chromium; a clear error where it is missing."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"no Chromium at {CHROMIUM}: run `make browser` "
                           "(apt-get install -y chromium) or set MAMBALEARN_CHROMIUM")
    return CHROMIUM


READY = "() => window.mambalearnDeck && window.mambalearnDeck.ready === true"

# Every (sub)slide in turn, all fragments shown: what a presenter sees, the slide section's own
# size (scrollWidth x scrollHeight: reveal's 960 x 700 box, or more where something sticks out),
# the box of its visible content in slide pixels (reveal scales the 960 x 700 slide to the
# window), the smallest font on it, and any element that hides part of its content (a scroll box
# or a clip; a code cell that deck.js lets scroll is counted apart), the smallest label of its
# figures in slide pixels (the tag slides_layout puts on a figure's cell: its smallest font at the
# figure's own size, scaled by how wide the image is shown) and the words of printed output that
# wrap at a hyphen ("ssd-" / "h200.json").
MEASURE = """async (deck) => {
    const [W, H] = [deck.width, deck.height];
    const frame = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    const slides = document.querySelector('.reveal .slides');
    const text = document.createRange();
    const rows = [];
    const stacks = Reveal.getHorizontalSlides();
    for (let h = 0; h < stacks.length; h++) {
        const n = Math.max(1, stacks[h].querySelectorAll(':scope > section').length);
        for (let v = 0; v < n; v++) {
            Reveal.slide(h, v, 10000);
            await frame();
            const s = Reveal.getCurrentSlide();
            const box = slides.getBoundingClientRect();
            const k = box.width / W;  // reveal's scale of the slide to the window
            let [x0, y0, x1, y1, font, hidden, scrolls, figureFont] = [W, H, 0, 0, 99, [], 0, 99];
            for (const e of s.querySelectorAll('*')) {
                if (e.closest('aside.notes, script, .MJX_Assistive_MathML')) continue;
                const scroller = e.closest('.ml-scroll');  // a code cell scrolling in its box
                if (scroller && scroller !== e) continue;
                const r = e.getBoundingClientRect();
                if (r.width === 0 || r.height === 0) continue;
                const rects = [r];
                for (const c of scroller ? [] : e.childNodes) {  // text can run past its box
                    if (c.nodeType !== 3 || !c.data.trim()) continue;
                    text.selectNodeContents(c);
                    rects.push(...text.getClientRects());
                }
                for (const q of rects) {
                    x0 = Math.min(x0, (q.left - box.left) / k);
                    x1 = Math.max(x1, (q.right - box.left) / k);
                    y0 = Math.min(y0, (q.top - box.top) / k);
                    y1 = Math.max(y1, (q.bottom - box.top) / k);
                }
                const cs = getComputedStyle(e);
                if (rects.length > 1 || scroller === e) {  // text: its size in slide px, zoomed
                    let zoom = 1;
                    for (let a = e; a && a !== slides; a = a.parentElement)
                        zoom *= parseFloat(getComputedStyle(a).zoom) || 1;
                    font = Math.min(font, parseFloat(cs.fontSize) * zoom);
                }
                const clipX = cs.overflowX !== 'visible' && e.scrollWidth > e.clientWidth + 1;
                const clipY = cs.overflowY !== 'visible' && e.scrollHeight > e.clientHeight + 1;
                // a code cell too long for any slide scrolls there (deck.js: class ml-scroll)
                if (clipX || (clipY && !e.classList.contains('ml-scroll')))
                    hidden.push(e.className || e.tagName);
                scrolls += clipY && e.classList.contains('ml-scroll');
                const tag = e.tagName === 'IMG' && e.closest('[class*="celltag_ml-figure-font-"]');
                if (tag) {
                    const px = parseFloat(
                        tag.className.match(/celltag_ml-figure-font-([\\d.]+)/)[1]);
                    const natural = parseFloat(e.getAttribute('width')) || e.naturalWidth;
                    figureFont = Math.min(figureFont, px * (r.width / k) / natural);
                }
            }
            const broken = [];  // a word of output wrapped at a hyphen: its two sides on two lines
            for (const pre of s.querySelectorAll('pre.ml-wrap')) {
                const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
                for (let t = walker.nextNode(); t; t = walker.nextNode()) {
                    for (const m of t.data.matchAll(/\\S-\\S/g)) {
                        const side = (i) => { text.setStart(t, i); text.setEnd(t, i + 1);
                                              return text.getBoundingClientRect().top; };
                        if (Math.abs(side(m.index) - side(m.index + 2)) > 2)
                            broken.push(t.data.slice(Math.max(0, m.index - 20), m.index + 20));
                    }
                }
            }
            const heading = s.querySelector('h1, h2, h3')?.cloneNode(true);
            heading?.querySelectorAll('script, .anchor-link, .MJX_Assistive_MathML')
                .forEach((e) => e.remove());
            const shown = [...s.querySelectorAll('.fragment')].every(
                (f) => f.classList.contains('visible'));
            const [sw, sh] = [s.scrollWidth, s.scrollHeight];
            rows.push({h, v, title: heading ? heading.textContent.trim() : '',
                       left: x0, top: y0, right: x1, bottom: y1, font, hidden, shown, scrolls,
                       figureFont, broken,
                       width: sw, height: sh,
                       fits: sw <= W && sh <= H && shown && x0 >= -1 && y0 >= -1
                             && x1 <= W + 1 && y1 <= H + 1 && !hidden.length});
        }
    }
    Reveal.slide(0, 0, 0);
    return rows;
}"""


# Every code cell of the notebook (nbconvert gives its element the cell's id; a continuation made
# by deck.js is a copy without one): the slide it is on, the code it shows, whether its output
# is on the same slide, and whether the slide has more of the same cell (its output continued).
CODE_CELLS = """() => {
    const rows = [];
    Reveal.getSlides().forEach((s, slide) => {
        for (const cell of s.querySelectorAll('.jp-CodeCell[id]')) {
            const code = cell.querySelector('.jp-Cell-inputWrapper pre');
            const out = [...cell.querySelectorAll('.jp-OutputArea-output')].filter(
                (o) => o.textContent.trim() || o.querySelector('img'));
            // a block wrapped by deck.js holds one span per line (an empty one: a zero-width space)
            const text = !code ? null : !code.classList.contains('ml-wrap') ? code.textContent
                : [...code.children].map((l) => l.textContent.replace(/\\u200b/g, '')).join('\\n');
            rows.push({id: cell.id.replace(/^cell-id=/, ''), slide, code: text,
                       output: out.length > 0});
        }
    });
    return rows;
}"""


PRESENTER = {"width": 960, "height": 700}  # a window of the slide's own size: what fits is measured


def open_deck(browser, deck, query="", viewport=None):
    """A page showing ``deck`` laid out and started, every non-file request refused.

    Returns (page, refused URLs). ``query``: e.g. ``?print-pdf`` for reveal's print view;
    ``viewport``: the window's size (default 1280 x 800).
    """
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 800},
                                  offline=True)
    refused = []

    def block(route):
        if route.request.url.startswith("file:"):
            return route.continue_()
        refused.append(route.request.url)
        return route.abort()

    context.route("**/*", block)
    page = context.new_page()
    page.goto(Path(deck).resolve().as_uri() + query, wait_until="load")
    # deck.js lays the slides out once MathJax has typeset, then starts reveal.js
    page.wait_for_function(READY, timeout=90_000)
    return page, refused


def measure(browser, deck):
    """One row per (sub)slide of ``deck``, measured in a 960 x 700 window with every fragment
    shown: position ``h``/``v``, ``title``, the slide section's ``width`` and ``height``
    (``scrollWidth``, ``scrollHeight``), the content box ``left, top, right, bottom`` in slide
    pixels, the smallest ``font`` (px), ``hidden`` (elements that clip content), ``scrolls`` (code
    cells too long for a slide, scrolling in it), ``figureFont`` (the smallest figure label, px
    on the slide; 99 without figures), ``broken`` (output words wrapped at a hyphen), ``shown``
    (every fragment visible) and ``fits`` (all of it inside the 960 x 700 slide)."""
    page, _ = open_deck(browser, deck, "?transition=none", PRESENTER)
    try:
        return measure_page(page)
    finally:
        page.context.close()


def measure_page(page):
    """``measure``'s rows on a deck already open (``open_deck``); ends on the first slide."""
    from course.classroom.deck import HEIGHT, WIDTH

    return page.evaluate(MEASURE, {"width": WIDTH, "height": HEIGHT})


def describe(row):
    """``#/3/1 "Title": 1020x740 px`` for a report (the larger of the section's size and its
    content's box)."""
    w = max(row.get("width", 0), row["right"] - min(row["left"], 0))
    h = max(row.get("height", 0), row["bottom"] - min(row["top"], 0))
    clip = f", clipped in {row['hidden'][:2]}" if row["hidden"] else ""
    return f'#/{row["h"]}/{row["v"]} "{row["title"][:50]}": {w:.0f}x{h:.0f} px{clip}'


def pdf(deck, out=None, browser=None):
    """Print ``deck`` to ``out`` (default: ``<name>.pdf``) through Chromium's print view.

    ``browser``: a Playwright Chromium to reuse; by default one is started and closed here.
    """
    out = Path(out) if out else Path(deck).with_suffix("").with_suffix(".pdf")
    if browser is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            own = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
            try:
                return pdf(deck, out, own)
            finally:
                own.close()
    page, refused = open_deck(browser, deck, "?print-pdf")
    page.pdf(path=str(out), prefer_css_page_size=True, print_background=True)
    page.context.close()
    if refused:
        print(f"warning: {deck} asked for {len(refused)} remote URL(s), e.g. {refused[0]}",
              file=sys.stderr)
    return out


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="python -m course.classroom.slides_offline",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="npm packages -> build/vendor (once)")
    f.add_argument("--force", action="store_true", help="fetch again")
    d = sub.add_parser("pdf", help="print decks to PDF through Chromium")
    d.add_argument("decks", nargs="+", help="NN_name.slides.html files")
    args = p.parse_args(argv)
    if args.command == "fetch":
        print(fetch(force=args.force))
    else:
        for deck in args.decks:
            print(pdf(deck))
    return 0


if __name__ == "__main__":
    sys.exit(main())
