"""The course's tooling, beside the library students read (``mambalearn``), never inside it.

    classroom   grading, the gradebook, slides, offline decks, the site (instructors, CI)
    bench       the benchmark topics the chapters run (``python -m mambalearn bench``)
    doctor      is this machine ready for the course? (``python -m mambalearn doctor``)
    __main__    the command line: ``python -m mambalearn COMMAND`` (``mambalearn/__main__.py``
                hands its arguments here; ``python -m course COMMAND`` is the same program)

It imports ``mambalearn``; nothing in ``mambalearn`` imports it but the command line's face.
"""
