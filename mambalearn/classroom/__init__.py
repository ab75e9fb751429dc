"""Instructor tooling (not course content): grading, the gradebook, slides, offline decks, the site.

    grade           grade one exercise notebook (``python -m mambalearn grade``)
    gradebook       grade a class folder in parallel into a CSV
    slides          reveal.js decks from the chapters
    slides_offline  decks with local assets, PDFs
    site            the static site of executed chapters
"""
