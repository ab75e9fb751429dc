"""Slide export: one <section> per slide or subslide cell, speaker notes kept, nothing skipped leaks."""

import re
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def test_chapter_01_deck(tmp_path):
    nb_path = ROOT / "notebooks" / "01_discretization.ipynb"
    # a subprocess: a kernel started from inside a pytest worker that already ran nbval can hang
    subprocess.run([sys.executable, "-m", "mambalearn.classroom.slides", str(nb_path), "--out", str(tmp_path)],
                   check=True, timeout=600)
    html = (tmp_path / "01_discretization.slides.html").read_text()
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nbformat.read(nb_path, as_version=4).cells]
    # reveal.js nests: each slide is an outer <section> holding one <section> per (sub)slide
    assert html.count("<section") == 2 * kinds.count("slide") + kinds.count("subslide")
    assert html.count('<aside class="notes"') == kinds.count("notes")
    assert "interact(" not in html  # the live-widget cell is skip
    assert re.search(r'<img[^>]*src="data:image/png', html)  # figures executed and embedded
