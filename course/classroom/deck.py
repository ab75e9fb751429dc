"""The deck's template: nbconvert's reveal.js slides with a projector's fonts and a layout step.

``exporter()`` is a SlidesExporter whose template extends nbconvert's reveal ``index.html.j2``:

* ``deck.css``: prose 21 px, code 17 px (88 characters across the slide), printed output 16 px,
  no ``In [n]:`` prompts, lines never wrapped;
* ``deck.js``: once math is typeset and fonts and figures loaded, every slide that is taller
  than reveal's 960 x 700 box continues on a new slide below it (whole cells first, then
  between paragraphs, between code and output, between lines), a block wider than the slide
  gets a smaller font, and only then reveal.js starts;
* reveal.js in linear navigation (the arrow keys step through every slide, subslide and
  fragment), slide numbers, top-aligned slides, one PDF page per slide in the print view
  (``?print-pdf``), and ``window.Reveal`` / ``window.mambalearnDeck`` for tests;
* images inside the deck (``course.classroom.pages`` makes markdown images attachments,
  nbconvert embeds them); MathJax without automatic line breaks;
* no mermaid.js (an ES module from a CDN; no chapter draws mermaid diagrams).

Offline decks (the default of ``course.classroom.slides``) take every asset from
``<out_dir>/vendor`` (``course.classroom.slides_offline``); else reveal.js and MathJax come
from public CDNs.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
WIDTH, HEIGHT = 960, 700
CONFIG = {"controls": True, "progress": True, "history": True, "center": False,
          "navigationMode": "linear", "slideNumber": "c/t", "width": WIDTH, "height": HEIGHT,
          "margin": 0.04, "pdfSeparateFragments": False, "pdfMaxPagesPerSlide": 1}
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}
<script>document.documentElement.classList.add("ml-layout");</script>
<script type="text/x-mathjax-config">
// no automatic line breaks: in a table cell MathJax broke "(b, c, h, p)" before it knew the
// column's width; a formula too wide for the slide is caught by the deck's check instead
MathJax.Hub.Config({CommonHTML: {linebreaks: {automatic: false}}});
</script>
<style type="text/css">
{{ resources.mambalearn.css }}
</style>
{%- endblock html_head_css -%}
{% block footer_js %}
{%- set prefix = resources.reveal.url_prefix
      | default('https://unpkg.com/reveal.js@4.0.2', true) -%}
<script>
{{ resources.mambalearn.js }}
mambalearnDeck.start({
  reveal: "{{ prefix }}/dist/reveal.js",
  notes: "{{ prefix }}/plugin/notes/notes.js",
  config: {{ resources.mambalearn.config | tojson }}
});
</script>
{% endblock footer_js %}
"""


def exporter():
    """A SlidesExporter with the deck's template (CDN assets until
    ``slides_offline.configure(exporter, out_dir, template=False)`` points it at local ones)."""
    from jinja2 import DictLoader
    from nbconvert import SlidesExporter

    ex = SlidesExporter(embed_images=True)  # images inside the deck, not beside it
    ex.extra_loaders = [DictLoader({"mambalearn_deck.html.j2": TEMPLATE})]
    ex.template_file = "mambalearn_deck.html.j2"
    return ex


def resources(name, path=".", transition="slide"):
    """The resources ``exporter().from_notebook_node`` needs: the notebook's ``name`` and folder
    (``path``: where its markdown images are found), the deck's assets."""
    config = dict(CONFIG, transition=transition)
    return {"metadata": {"name": name, "path": str(path)},
            "mambalearn": {"css": (HERE / "deck.css").read_text(),
                           "js": (HERE / "deck.js").read_text(), "config": config}}
