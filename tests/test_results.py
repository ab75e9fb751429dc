"""The store of measurements: its files follow the schema, the reader finds the newest figure or
says clearly why not, and no figure of the store is copied as a literal into what students read.
"""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from mambalearn import results

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(results.STORE.glob("*.json"))


def _store(tmp_path, files):
    for name, (meta, rows) in files.items():
        full = {k: "not recorded" for k in results.META} | {"peers": {}} | meta
        (tmp_path / name).write_text(json.dumps({"meta": full, "rows": rows}))
    return tmp_path


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_file_names_its_run(path):
    device, topic, date, run = results._parse(path)
    data = json.loads(path.read_text())
    meta = data["meta"]
    missing = set(results.META) - set(meta)
    assert not missing, f"{path.name}: meta lacks {missing}"
    assert meta["date"] == date and meta["command"] and meta["commit"] and meta["method"]
    assert isinstance(meta["peers"], dict) and data["rows"], path.name
    for row in data["rows"]:
        if topic.startswith("outputs-"):  # GPU-only cells as recorded (classroom.pages)
            assert set(row) == {"cell", "source_sha256", "outputs"}, row
            assert isinstance(row["outputs"], list) and len(row["source_sha256"]) == 64, row
            continue
        assert all(v is None or isinstance(v, (str, int, float, bool)) for v in row.values()), row
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row


def test_the_newest_run_wins_row_by_row(tmp_path):
    run = lambda date, *rows: ({"date": date}, [dict(backend=b, shape=s, ms=t) for b, s, t in rows])
    store = _store(tmp_path, {
        "h200_demo_2026-01-01.json": run("2026-01-01", ("ours", "b1", 2.0), ("peer", "b1", 3.0)),
        "h200_demo_2026-01-02.json": run("2026-01-02", ("ours", "b1", 1.5)),
        "h200_demo_2026-01-02.2.json": run("2026-01-02", ("ours", "b2", 9.0)),
        "h200_demo_2026-01-02.10.json": run("2026-01-02", ("ours", "b3", 7.0)),
    })
    assert [p.name for p in results.files("demo", store=store)][:2] == [
        "h200_demo_2026-01-02.10.json", "h200_demo_2026-01-02.2.json"]
    assert results.value("demo", "ms", store=store, backend="ours", shape="b1") == 1.5
    assert results.value("demo", "ms", store=store, backend="peer") == 3.0  # only in the old run
    assert sorted(r["ms"] for r in results.rows("demo", store=store)) == [1.5, 3.0, 7.0, 9.0]
    found = results.find("demo", "ms", store=store, shape="b2")
    assert found.path.name == "h200_demo_2026-01-02.2.json" and "2026-01-02" in found.source
    assert results.cite("demo", "ms", fmt=".1f", store=store, shape="b3").startswith("7.0 ms (")
    assert [f.row["ms"] for f in results.every("demo", "ms", store=store, backend="ours",
                                               shape="b1")] == [1.5, 2.0]


def test_missing_figures_are_clear_errors(tmp_path):
    store = _store(tmp_path, {"h200_demo_2026-01-01.json": ({"date": "2026-01-01"},
                                                            [{"backend": "ours", "ms": 1.0}])})
    with pytest.raises(LookupError, match=r"topic 'nope'.*topics there: \['demo'\]"):
        results.load("nope", store=store)
    with pytest.raises(LookupError, match="no results for topic 'demo' on device 'a100'"):
        results.value("demo", "ms", device="a100", store=store)
    with pytest.raises(LookupError, match=r"\{'backend': 'peer'\} and a number under 'ms'"):
        results.value("demo", "ms", store=store, backend="peer")
    with pytest.raises(LookupError, match="no results store"):
        results.files("demo", store=tmp_path / "absent")
    (tmp_path / "h200_bad_2026-01-01.json").write_text(json.dumps({"meta": {}, "rows": []}))
    with pytest.raises(ValueError, match="meta lacks"):
        results.load("bad", store=store)
    (tmp_path / "H200 demo.json").write_text("{}")
    with pytest.raises(ValueError, match="is named <device>_<topic>"):
        results.topics(store=store)


# --- no figure of the store written out by hand -------------------------------------------------
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.]*\d)")
UNIT = re.compile(r"\s*(\*\*)?\s*(ms|µs|us|s\b|GB|MB|TB/s|GB/s|TFLOP|GHz|%|×)")


def significant(text):
    """Significant digits of a decimal literal ("0.0470" → 3, "4.25e12" → 3)."""
    mantissa = re.split(r"[eE]", text)[0].replace(".", "").lstrip("0")
    return len(mantissa)


def quoted_figures():
    """{(digits, figure rounded to them): {files}} for every measured float of the store.

    A figure typed in by hand (≤ 5 significant digits: 0.47 is "0.470"; never an integer like
    15.0) is looked for at 3 significant digits and more; a raw measurement
    (0.5696640014648438) at 4 and more, so that 3-digit literals do not meet it by chance."""
    figures = {}
    for path in FILES:
        for row in json.loads(path.read_text())["rows"]:
            for v in row.values():
                if not isinstance(v, float) or v == 0:
                    continue
                digits = significant(repr(abs(v)).split("e")[0].rstrip("0").rstrip("."))
                if digits < 2 or (digits == 2 and v == round(v)):
                    continue
                for s in range(3 if digits <= 5 else 4, 8):
                    x = float(f"{v:.{s}g}")
                    if significant(repr(x).rstrip("0").rstrip(".")) >= 2:  # not 99.99995 → 100
                        figures.setdefault((s, x), set()).add(path.name)
    return figures


def copies(text, figures):
    """The literals of ``text`` that copy a figure: [(line, literal)].

    A literal of ≥ 3 significant digits equal to a figure counts when it is written as one (a unit
    after it: "0.470 ms", "4.25 TB/s"), in powers of ten ("4.25e12": the figure in other units),
    or next to another figure of the same results file on its line (a table row, a list of
    times). A plot coordinate that happens to equal some figure is none of these."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        hits = []
        for m in NUMBER.finditer(line):
            lit, s = m[1], significant(m[1])
            value, scaled = float(lit), "e" in lit.lower()
            mantissa = float(re.split(r"[eE]", lit)[0]) if scaled else value
            files = figures.get((s, value), set()) | set().union(*(
                figures.get((s, float(f"{mantissa * 10.0 ** (3 * k):.{s}g}")), set())
                for k in range(-4, 5))) if scaled else figures.get((s, value), set())
            if files and s >= 3:
                hits.append((lit, files, scaled or bool(UNIT.match(line, m.end()))))
        for lit, files, alone in hits:
            if alone or any(f & files for other, f, _ in hits if other != lit):
                out.append((n, lit))
    return out


def student_text():
    """(where, text) of every notebook, exercise and solution cell and every library module."""
    for d in ("notebooks", "solutions", "exercises"):
        for nb in sorted((ROOT / d).glob("*.ipynb")):
            for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
                yield f"{d}/{nb.name} cell {i}", "".join(cell["source"])
    for py in sorted(p for d in ("mambalearn", "course") for p in (ROOT / d).rglob("*.py")):
        yield str(py.relative_to(ROOT)), py.read_text()


# Copies in chapters another branch is rewriting: listed until that branch lands, and checked to
# be still there (an entry whose copy is gone fails, so the list only shrinks).
PENDING = set()


def test_no_figure_of_the_store_is_copied_into_the_course():
    """A number the course quotes is printed from ``mambalearn.results`` (so it cannot drift
    from the run it came from), never typed in: no notebook, exercise, solution or library
    module writes a measured figure of the store as a literal."""
    figures = quoted_figures()
    found = {where: copies(text, figures) for where, text in student_text()}
    bad = [f"{w}, line {n}: {lit}" for w, hits in found.items() if w not in PENDING
           for n, lit in hits]
    assert not bad, "figures of docs/results copied by hand:\n" + "\n".join(bad)
    assert all(found.get(w) for w in PENDING), [w for w in PENDING if not found.get(w)]


def test_the_drift_check_sees_a_copied_figure():
    figures = quoted_figures()
    ms = results.value("selective_scan", "ms", backend="default", op="fwd",
                       shape="b8 d2048 n16 l2048")
    peer = results.value("selective_scan", "ms", backend="mamba_ssm cuda", op="fwd",
                         shape="b8 d2048 n16 l2048")
    bw = results.value("machine", "tb_per_s", what="copy bandwidth")
    assert copies(f"ours ran {ms:.3f} ms", figures) == [(1, f"{ms:.3f}")]
    assert copies(f"times = [{ms:.3f}, {peer:.3f}]", figures) == [(1, f"{ms:.3f}"),
                                                                  (1, f"{peer:.3f}")]
    assert copies(f"bandwidth = {bw}e12", figures) == [(1, f"{bw}e12")]
    assert copies(f"ax.text(0.5, {ms:.3f}, 'label')", figures) == []  # a coordinate, alone
    assert significant("0.0470") == 3 and significant("4.25e12") == 3
    assert [m[1] for m in NUMBER.finditer("torch 2.11.0+cu130, 2.3.2.post1, 1.5e-3, x1.25")] == \
        ["1.5e-3"]


def test_same_run_finds_the_peer_of_a_row(tmp_path):
    run = lambda date, *rows: ({"date": date}, [dict(backend=b, op=o, ms=ms) for b, o, ms in rows])
    store = _store(tmp_path, {
        "h200_demo_2026-01-01.json": run("2026-01-01", ("ours", "fwd", 2.0), ("peer", "fwd", 4.0),
                                         ("peer", "fwd+bwd", 9.0)),
        "h200_demo_2026-01-02.json": run("2026-01-02", ("peer", "fwd", 3.0))})
    ours = results.find("demo", "ms", store=store, backend="ours")
    assert results.same_run(ours, backend="peer").row["ms"] == 4.0  # its own run, not the newest
    with pytest.raises(LookupError, match="has no row"):
        results.same_run(ours, backend="nobody")


def test_benchmarks_md_is_the_generated_tables():
    """docs/BENCHMARKS.md is `python tools/benchmarks.py`'s output: edit the results, not it."""
    spec = importlib.util.spec_from_file_location("benchmarks", ROOT / "tools" / "benchmarks.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = tool.render()
    assert (ROOT / "docs" / "BENCHMARKS.md").read_text() == text, "run python tools/benchmarks.py"
    for topic in results.topics():  # every topic has its table, every file its line
        assert f"topic `{topic}`" in text
    assert all(f"`{p.name}`: " in text for p in FILES)


def test_the_cost_model_reads_the_newest_kernel_times():
    """Chapter 14's α–β model takes each rank's kernel times from the newest run that timed the
    shard's shape: a run of the kernels newer than the context-parallel one replaces its times."""
    from mambalearn.parallel import cost

    for model, (topic, match, shape) in cost.NEWER.items():
        newest = {}
        for f in results.current("parallel"):
            if f.row.get("model") != model or "tokens" not in f.row:
                continue
            try:
                fwd, fb = (results.find(topic, "ms", op=op, shape=shape.format(l=f.row["tokens"]),
                                        **match) for op in ("fwd", "fwd+bwd"))
            except LookupError:
                continue
            if min(fwd.meta["date"], fb.meta["date"]) > f.meta["date"]:
                newest[f.row["tokens"]] = fwd.row["ms"]
        table = cost.MAMBA1_RANK if model == "mamba1" else cost.SSD_RANK
        if newest:
            assert {t: v[0] for t, v in table.items()} == newest, model
            assert any(topic in s for s in cost.SOURCE.split("; ")), cost.SOURCE
