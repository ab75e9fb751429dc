"""Instructor tooling (not course content): grading, the gradebook, slides, offline decks, the site.

    grade           grade one exercise notebook (``python -m mambalearn grade``)
    gradebook       grade a class folder in parallel into a CSV
    execute         executed copies of the chapters, kept and shared by decks, site and tests
    slides          reveal.js decks from the chapters (the command line)
    slides_layout   what a code cell shows on a slide
    deck            the deck's template, CSS and in-browser layout (deck.css, deck.js)
    slides_offline  decks with local assets, PDFs, measuring slides in Chromium
    site            the static site of executed chapters
"""
