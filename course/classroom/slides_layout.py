"""What goes on a slide: rules applied to an executed chapter before nbconvert makes the deck.

The notebook stays as it is; the deck gets a copy in which, for every visible code cell,

1. **figures come without their code**: a cell whose output holds an image shows the image only
   (the code draws the picture; the picture is the point), and a cell that only defines
   plotting functions (their bodies use ``plt``, ``ax`` or ``fig``) and prints nothing is left
   out when it continues a slide. Tag a cell ``slides-show-code`` to keep its code,
   ``slides-hide-code`` to hide the code of any cell;
2. **plumbing stays off**: imports at the top of a cell (standard library, torch, numpy,
   matplotlib, ipywidgets and the course's utilities: ``mambalearn.testing``, ``timing``,
   ``utils``, ``device``, ``check``) are left out; imports of course modules stay, they say
   where the code lives;
3. **code fits the slide's width**: a line longer than ``CODE_WIDTH`` characters (what fits a
   960 px slide at the deck's code font) has its trailing comment moved above it, a long
   comment is wrapped at words, and a statement still too long is reformatted by ``ruff format``
   at that width (the same program either way: its syntax tree is compared before and after);
4. **no "skipped: no GPU" slides**: a GPU cell that could not run here and has no recorded GPU
   output (``course.classroom.pages``) is left out where it continues a slide;
5. **an interactive figure says so**: a skipped cell whose widget the site renders statically
   (``pages.static_widgets``: "Interactive in JupyterLab: …") gives that line to the visible code
   cell before it on its slide, the one that draws the same figure without sliders;
6. **every slide has a title**: a slide or subslide that does not open with a heading gets one,
   the title of the chapter section it is in (the last heading before it);
7. **a figure says how small its text is drawn**: a cell whose output holds an image gets the
   tag ``ml-figure-font-<px>``, the smallest font its code asks for (``fontsize=``,
   ``labelsize=``; matplotlib's 10 pt where none is given) in pixels at the figure's own size,
   so the deck test can measure the labels as a presenter sees them.

Everything that needs real sizes (moving cells that do not fit onto a continuation slide,
splitting long code or output at a line, shrinking a wide block) happens in the browser, where
the sizes are known: ``course.classroom.deck``.
"""

import ast
import copy
import importlib.util
import io
import re
import subprocess
import sys
import textwrap
import tokenize

from course.classroom import pages

CODE_WIDTH = 88  # characters of code per line at the deck's 17 px code font on a 960 px slide
SHOW_CODE, HIDE_CODE = "slides-show-code", "slides-hide-code"
PLUMBING = {"torch", "numpy", "matplotlib", "ipywidgets", "IPython", "tqdm", "mambalearn.testing",
            "mambalearn.timing", "mambalearn.utils", "mambalearn.device", "mambalearn.check"}


def prepare(nb, width=CODE_WIDTH):
    """A copy of the executed notebook ``nb`` with the rules above applied to its visible code."""
    nb = copy.deepcopy(nb)
    nb.cells = titled(nb.cells)
    interactive_notes(nb.cells)
    for cell in nb.cells:
        if cell.cell_type != "code" or _slide_type(cell) in ("skip", "notes"):
            continue
        tags = set(cell.metadata.get("tags", []))
        continues = _slide_type(cell) in ("-", "fragment")
        plumbing = SHOW_CODE not in tags and _defines_plots(cell)
        if continues and (plumbing or pages.is_skipped(cell)):
            cell.metadata["slideshow"] = dict(cell.metadata.get("slideshow", {}), slide_type="skip")
            continue
        if _draws_figure(cell):
            cell.metadata["tags"] = [*cell.metadata.get("tags", []),
                                     f"ml-figure-font-{figure_font(cell.source):g}"]
        if HIDE_CODE in tags or (_draws_figure(cell) and SHOW_CODE not in tags):
            cell.metadata["transient"] = {"remove_source": True}
            continue
        cell.source = fit_code(strip_plumbing(cell.source), width)
        if not cell.source.strip():
            cell.metadata["transient"] = {"remove_source": True}
    return nb


HEADING = re.compile(r"^ {0,3}(#{1,3})\s+(.+?)\s*#*\s*$", re.M)


def _headings(cell):
    if cell.cell_type != "markdown":
        return []
    fenced = re.sub(r"^```.*?^```", "", cell.source, flags=re.M | re.S)
    return [m.group(2) for m in HEADING.finditer(fenced)]


def titled(cells):
    """``cells`` where every slide and subslide opens with a heading: one that does not gets a
    markdown cell before it, ``### <section>``, the last heading of the cells before it (the
    new cell takes over its slide type; the cell continues the slide)."""
    from nbformat.v4 import new_markdown_cell

    out, section = [], None
    for cell in cells:
        kind = _slide_type(cell)
        if kind in ("slide", "subslide") and section and not (
                cell.cell_type == "markdown" and HEADING.match(cell.source.lstrip("\n"))):
            head = new_markdown_cell(f"### {section}", metadata={"slideshow": {"slide_type": kind}})
            head.id = f"{cell.get('id', 'cell')}-title"[:64]
            cell.metadata["slideshow"] = dict(cell.metadata["slideshow"], slide_type="-")
            out.append(head)
        if kind not in ("skip", "notes"):
            section = (_headings(cell) or [section])[-1]
        out.append(cell)
    return out


FONT_ARG = re.compile(r"\b(?:fontsize|labelsize|size)\s*=\s*(\d+(?:\.\d+)?|[\"'][a-z-]+[\"'])")
NAMED = {"xx-small": 0.579, "x-small": 0.694, "small": 0.833, "medium": 1.0, "large": 1.2,
         "x-large": 1.44, "xx-large": 1.728, "smaller": 0.833, "larger": 1.2}


def figure_font(source, base=10.0, dpi=None):
    """The smallest font ``source`` draws text in, in pixels at the figure's size: the
    ``fontsize=``/``labelsize=``/``size=`` it passes (points or matplotlib's names), else
    ``base`` points; ``dpi``: the figure's (default matplotlib's ``figure.dpi``)."""
    if dpi is None:
        import matplotlib

        dpi = matplotlib.rcParamsDefault["figure.dpi"]
    sizes = [base]
    for arg in FONT_ARG.findall(source):
        name = arg.strip("\"'")
        sizes.append(float(arg) if arg[0].isdigit() else base * NAMED.get(name, 1.0))
    return round(min(sizes) * dpi / 72, 1)


def interactive_notes(cells):
    """Move the "Interactive in JupyterLab" line of each skipped widget cell (made by
    ``pages.static_widgets``) to the last visible code cell before it on the same slide."""
    shown = None
    for cell in cells:
        kind = _slide_type(cell)
        if kind in ("slide", "subslide"):
            shown = None
        if cell.cell_type != "code" or kind == "notes":
            continue
        if kind != "skip":
            shown = cell
            continue
        lines = [o for o in cell.get("outputs", [])
                 if 'class="ml-widget"' in str(o.get("data", {}).get("text/html", ""))]
        if lines and shown is not None:
            shown.outputs = [*shown.get("outputs", []), *lines]


def _slide_type(cell):
    return cell.metadata.get("slideshow", {}).get("slide_type", "-")


def _draws_figure(cell):
    return any(k.startswith("image/") for o in cell.get("outputs", []) for k in o.get("data", {}))


PLOT_NAMES = {"plt", "ax", "axes", "fig", "matplotlib"}


def _defines_plots(cell):
    """True for a cell without output whose statements are all plotting function definitions."""
    if cell.get("outputs"):
        return False
    try:
        body = ast.parse(cell.source).body
    except SyntaxError:
        return False
    draws = lambda f: any(isinstance(n, ast.Name) and n.id in PLOT_NAMES for n in ast.walk(f))
    return bool(body) and all(isinstance(f, ast.FunctionDef) and draws(f) for f in body)


def _is_plumbing(module):
    root = module.split(".")[0]
    return root in sys.stdlib_module_names or any(
        module == p or module.startswith(p + ".") for p in PLUMBING)


def strip_plumbing(source):
    """``source`` without the plumbing imports it starts with (and the blank lines after them)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return source
    end = 0
    for stmt in body:
        if isinstance(stmt, ast.Import) and all(_is_plumbing(a.name) for a in stmt.names):
            end = stmt.end_lineno
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and _is_plumbing(stmt.module):
            end = stmt.end_lineno
        else:
            break
    return "\n".join(source.splitlines()[end:]).lstrip("\n") if end else source


def fit_code(source, width=CODE_WIDTH):
    """``source`` with every line at most ``width`` characters where that can be done safely.

    Trailing comments of long lines go above them, long comments are wrapped, then each
    top-level statement that still has a long line goes through ``ruff format``; a statement
    whose reformatted syntax tree differs from the original (it never should) is kept as it was.
    """
    source = _wrap_comments(source, width)
    lines = source.splitlines()
    try:
        body = ast.parse(source).body
    except SyntaxError:  # IPython magics and the like: leave it to the deck's font fitting
        return source
    for stmt in reversed(body):  # bottom up, so earlier line numbers stay valid
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        segment = lines[first - 1 : stmt.end_lineno]
        if max(map(len, segment)) > width:
            lines[first - 1 : stmt.end_lineno] = _ruff_format("\n".join(segment), width)
    return "\n".join(lines)


def _wrap_comments(source, width):
    """Move the trailing comment of a too-long line above it; wrap too-long comment lines."""
    lines = source.splitlines()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return source
    comments = {t.start[0]: t for t in tokens if t.type == tokenize.COMMENT}
    out = []
    for row, line in enumerate(lines, start=1):
        tok = comments.get(row)
        if tok is None or len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        code = line[: tok.start[1]].rstrip()
        text = tok.string.lstrip("#").strip()
        out += textwrap.wrap(text, width - len(indent) - 2, initial_indent=indent + "# ",
                             subsequent_indent=indent + "# ", break_long_words=False) or [line]
        if code.strip():
            out.append(code)
    return "\n".join(out)


def _ruff_format(segment, width):
    """``segment`` (one top-level statement) as ``ruff format`` writes it at ``width``; its
    lines, or the original lines if ruff is missing, fails, or changes the program."""
    original = segment.splitlines()
    if importlib.util.find_spec("ruff") is None:
        return original
    cmd = [sys.executable, "-m", "ruff", "format", "--isolated", f"--line-length={width}",
           "--config", "format.quote-style='preserve'", "-"]
    done = subprocess.run(cmd, input=segment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return original
    try:
        same = ast.dump(ast.parse(done.stdout)) == ast.dump(ast.parse(segment))
    except SyntaxError:
        same = False
    return done.stdout.rstrip("\n").splitlines() if same else original
