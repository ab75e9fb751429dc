"""`pytest --nbval-lax exercises/exNN_name.ipynb`: the self-check grades the notebook as `make grade`
does (restored checks, the chapter's library, the box, the checks outside the kernel), one pytest
item per cell, and prints the grader's report (docs/GRADING.md)."""

from course.classroom.runner import pytest_collect_file, pytest_terminal_summary  # noqa: F401
