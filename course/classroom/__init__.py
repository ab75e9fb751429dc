"""Instructor tooling (not course content): grading, the gradebook, slides, offline decks, the site.

    grade           ``python -m mambalearn grade``: one notebook (or ``--class``), the report
    gradebook       grade a class folder in parallel into a CSV
    classpage       a feedback file per student and the class page
    submission      grade one submission: identify, restore, run boxed
    verdict         per-cell results → one row per task: passed or not, and why
    copies          solution code copied from the library (it scores 0)
    submit          check a notebook and package it for handing in (``make submit``)
    pristine        the shipped exercises, built from solutions/; make-exercise, restore
    syllabus        what a student of chapter N may use: the chapter of every module
    redact          the graded library copy: that, with the exercise's answers switched off
    sandbox         the bubblewrap box and resource limits of a submission's kernel
    kernel          a boxed Jupyter kernel, driven cell by cell, watched for death and time
    session         one submission's kernel and cells: code in the kernel, checks here
    runner          nbval runs a graded notebook (``session``); the student's self-check too
    remote          the bridge: a check's stand-in for the student's function in the kernel
    exercises       ``python -m mambalearn exercises``: exercises/ from solutions/, work kept
    execute         executed copies of the chapters, kept and shared by decks, site and tests
    pages           the copy a deck or page is made from: images inside, recorded GPU outputs
    slides          reveal.js decks from the chapters (the command line), the course's PDF
    slides_layout   what a code cell shows on a slide
    deck            the deck's template, CSS and in-browser layout (deck.css, deck.js)
    slides_offline  decks with local assets, PDFs, measuring slides in Chromium
    site            the static site of executed chapters (site.css, site.js)
    cli             the parsers of every command: one program name, "did you mean"
"""
