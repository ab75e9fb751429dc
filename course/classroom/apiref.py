"""The site's API reference: every public module of the library, from its docstrings.

``modules()`` reads the source (``ast``; nothing is imported, so no kernel is compiled and no
GPU is asked for): each module the chapter map (``mambalearn.chapters``) gives a chapter, with its
docstring and its public functions and classes (``__all__`` where a module has one, else the
names without a leading ``_``), their signatures and docstrings. ``page(...)`` is ``api.html``'s
body, ``entries(...)`` its search entries, and ``anchor(module, name)`` the id code on the
chapter pages links to.
"""

import ast
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from course.classroom import syllabus
from mambalearn.chapters import TOOLING


@dataclass
class Member:
    """A public function or class: ``name``, ``kind`` ("def" or "class"), ``signature``, ``doc``,
    and a class's public methods (``Member`` each)."""

    name: str
    kind: str
    signature: str
    doc: str
    methods: list = field(default_factory=list)


@dataclass
class Module:
    name: str
    chapter: int
    doc: str
    members: list


def _signature(node):
    args = ast.unparse(node.args)
    ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"({args}){ret}"


def _public(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def _members(tree):
    wanted = _public(tree)
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if (wanted is not None and node.name not in wanted) or \
                (wanted is None and node.name.startswith("_")):
            continue
        if isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef)
                         and n.name == "__init__"), None)
            sig = _signature(init).replace("(self, ", "(").replace("(self)", "()") if init else ""
            methods = [Member(n.name, "def", _signature(n), ast.get_docstring(n) or "")
                       for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and not n.name.startswith("_")]
            out.append(Member(node.name, "class", sig, ast.get_docstring(node) or "", methods))
        else:
            out.append(Member(node.name, "def", _signature(node), ast.get_docstring(node) or ""))
    return out


def modules(package=syllabus.PACKAGE):
    """[Module] of every public module of the library, in chapter order, then by name."""
    found = []
    for name, path in syllabus.modules(package).items():
        if any(part.startswith("_") for part in name.split(".")[1:]):
            continue
        if any(name == t or name.startswith(t + ".") for t in TOOLING):
            continue
        chapter = syllabus.chapter_of(name)
        if chapter is None:
            continue
        try:
            tree = ast.parse(Path(path).read_text())
        except SyntaxError:
            continue
        members = _members(tree)
        doc = ast.get_docstring(tree) or ""
        if members or doc:
            found.append(Module(name, chapter, doc, members))
    return sorted(found, key=lambda m: (m.chapter, m.name))


def anchor(module, name=None):
    """The id of ``module`` (or of ``module.name``) on api.html."""
    return f"{module}.{name}" if name else module


def names(mods):
    """{"module.name": anchor} of every documented module and member (for links from code)."""
    out = {}
    for m in mods:
        out[m.name] = anchor(m.name)
        for member in m.members:
            out[f"{m.name}.{member.name}"] = anchor(m.name, member.name)
    return out


def _doc_html(doc):
    """A docstring as HTML: paragraphs, ``code`` spans, indented blocks as code."""
    parts = []
    for block in re.split(r"\n\s*\n", doc.strip()):
        lines = block.splitlines()
        if lines and all(line.startswith("    ") for line in lines if line.strip()):
            parts.append(f"<pre>{html.escape(chr(10).join(x[4:] for x in lines))}</pre>")
            continue
        text = html.escape(" ".join(x.strip() for x in lines))
        text = re.sub(r"``(.+?)``", r"<code>\1</code>", text)
        parts.append(f"<p>{text}</p>")
    return "".join(parts)


def _member_html(module, m, prefix=""):
    ident = anchor(module, prefix + m.name)
    head = (f'<h4 id="{html.escape(ident)}"><code>{m.kind} <b>{html.escape(prefix + m.name)}'
            f"</b>{html.escape(m.signature)}</code></h4>")
    body = _doc_html(m.doc) if m.doc else "<p><i>(no docstring)</i></p>"
    methods = "".join(_member_html(module, x, prefix + m.name + ".") for x in m.methods)
    return f'<div class="ml-api-member">{head}{body}{methods}</div>'


def page(mods, chapter_pages):
    """The body of api.html: a contents list, then each module with its members.

    ``chapter_pages``: {chapter number: (page, title)} for the "introduced in" links."""
    toc = "".join(f'<li><a href="#{html.escape(anchor(m.name))}"><code>{m.name}</code></a></li>'
                  for m in mods)
    out = ['<h1 id="api">API reference</h1><p>Every public module of <code>mambalearn</code>, '
           "with the chapter that introduces it, from its docstrings.</p>",
           f'<ul class="ml-api-toc">{toc}</ul>']
    for m in mods:
        where = chapter_pages.get(m.chapter)
        intro = (f'<p class="ml-api-chapter">Introduced in <a href="{where[0]}">'
                 f"{html.escape(where[1])}</a></p>" if where else
                 ('<p class="ml-api-chapter">Used by every chapter.</p>' if m.chapter == 0
                  else ""))
        out.append(f'<section class="ml-api-module"><h2 id="{html.escape(anchor(m.name))}">'
                   f"<code>{m.name}</code></h2>{intro}{_doc_html(m.doc)}"
                   + "".join(_member_html(m.name, x) for x in m.members) + "</section>")
    return "\n".join(out)


def entries(mods):
    """Search entries: one per module and per public function or class."""
    out = []
    for m in mods:
        first = m.doc.strip().split("\n\n")[0] if m.doc else ""
        out.append({"page": "api.html", "id": anchor(m.name), "chapter": "API",
                    "title": m.name, "text": re.sub(r"\s+", " ", first)[:400], "kind": "api"})
        for x in m.members:
            first = x.doc.strip().split("\n\n")[0] if x.doc else ""
            out.append({"page": "api.html", "id": anchor(m.name, x.name),
                        "chapter": f"API · {m.name}", "title": f"{x.name}{x.signature}"[:120],
                        "text": re.sub(r"\s+", " ", first)[:400], "kind": "api"})
    return out
