"""Slide export: one <section> per slide or subslide cell, speaker notes kept, nothing skipped leaks."""

from pathlib import Path

import nbformat

from mambalearn import slides

ROOT = Path(__file__).resolve().parent.parent


def test_chapter_01_deck(tmp_path):
    nb_path = ROOT / "notebooks" / "01_discretization.ipynb"
    html = slides.export(nb_path, tmp_path).read_text()
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nbformat.read(nb_path, as_version=4).cells]
    # reveal.js nests: each slide is an outer <section> holding one <section> per (sub)slide
    assert html.count("<section") == 2 * kinds.count("slide") + kinds.count("subslide")
    assert html.count('<aside class="notes"') == kinds.count("notes")
    assert "interact(" not in html  # the live-widget cell is skip
    assert "data:image/png" in html  # figures were executed and embedded
