"""Solution code copied from the library: found, named, and scored 0.

A function in a student's solution cell whose body is the body of a function of the ``mambalearn``
package — the same syntax tree, whatever its name, comments, layout and docstring — is a copy. Only
functions of at least ``MIN_NODES`` syntax nodes count: short ones (a five-line loop) are written
the same way by many. The grader fails the task with the copy's name as the reason.
"""

import ast
import functools

from course.classroom import syllabus

MIN_NODES = 100
PACKAGE = syllabus.PACKAGE  # the mambalearn package


def _body(node):
    """The dump of a function's body without its docstring: what a copy keeps."""
    stmts = list(node.body)
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant):
        stmts = stmts[1:]
    return ast.dump(ast.Module(body=stmts, type_ignores=[]))


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and len(list(ast.walk(node))) >= MIN_NODES:
            yield node


@functools.lru_cache(maxsize=4)
def library(package=PACKAGE):
    """{body dump: "mambalearn.module.function"} of every function of some size in the package."""
    bodies = {}
    for module, path in syllabus.modules(package).items():
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        for node in _functions(tree):
            bodies.setdefault(_body(node), f"{module}.{node.name}")
    return bodies


def found(source, package=PACKAGE):
    """[(the student's function, the library function it copies)] in a solution cell's source."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lib = library(package)
    return [(node.name, lib[_body(node)]) for node in _functions(tree) if _body(node) in lib]
