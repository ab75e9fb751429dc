"""The store of measurements: every measured number of the course, read from one place.

Each run on a device is one JSON file ``docs/results/<device>_<topic>_<date>[.<k>].json``
(``k`` = 2, 3, … for later runs of a day), written by ``bench/gpu/record.py``:

    {"meta": {"device", "date", "command", "commit", "torch", "triton", "peers": {name: version},
              "method", ...},
     "rows": [{flat keys: what was run (strings, integers) and what was measured (floats)}]}

A row's *identity* is its fields that are not floats (backend, shape, op, b, l, …); its floats
are the measurements. The newest file of a topic that has a row with that identity holds its current
figure, so a new run replaces what it re-measures and leaves the rest.

    files(topic)                 the topic's files, newest first
    load(topic)                  the newest file: {"meta", "rows", "path"};  read(path) one file
    rows(topic, **match)         the current rows (newest per identity) whose fields equal match
    find(topic, key, **match)    the newest matching row that has ``key``: a :class:`Found`
    every(topic, key, **match)   that row in each run that has it (one measurement over time)
    same_run(found, **changes)   the row of the same run that differs in ``changes`` (the peer)
    value(topic, key, **match)   its number;  cite(...) the number with its source
    source(path)                 "NVIDIA H200, 2026-12-01, docs/results/h200_ssd_2026-12-01.json"

The store is ``$MAMBALEARN_RESULTS`` or the repository's ``docs/results/``.
"""

import copy
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
STORE = Path(os.environ.get("MAMBALEARN_RESULTS") or ROOT / "docs" / "results")
NAME = re.compile(r"^(?P<device>[a-z0-9]+)_(?P<topic>[a-z0-9_-]+)_(?P<date>\d{4}-\d{2}-\d{2})"
                  r"(?:\.(?P<run>[2-9]|[1-9]\d+))?\.json$")
META = ("device", "date", "command", "commit", "torch", "triton", "peers", "method")


class Found(NamedTuple):
    """One row, the meta of its file, and the file."""

    row: dict
    meta: dict
    path: Path

    @property
    def source(self):
        return source(self.path)


def _parse(path):
    m = NAME.match(Path(path).name)
    if not m:
        raise ValueError(f"{path}: a results file is named "
                         f"<device>_<topic>_<YYYY-MM-DD>[.<k>].json")
    return m["device"], m["topic"], m["date"], int(m["run"] or 1)


def devices(store=None):
    """The devices the store has files for."""
    return sorted({d for d, *_ in map(_parse, Path(store or STORE).glob("*.json"))})


def topics(device="h200", store=None):
    """The topics the store has files for on ``device``."""
    return sorted({t for d, t, *_ in map(_parse, Path(store or STORE).glob("*.json"))
                   if d == device})


def files(topic, device="h200", store=None):
    """The topic's files on ``device``, newest first (date, then the run number of the day)."""
    store = Path(store or STORE)
    if not store.is_dir():
        raise LookupError(f"no results store at {store} (set MAMBALEARN_RESULTS to the "
                          f"repository's docs/results)")
    found = [(_parse(p), p) for p in store.glob(f"{device}_{topic}_*.json")]
    found = sorted(((date, run), p) for (d, t, date, run), p in found if (d, t) == (device, topic))
    if not found:
        raise LookupError(f"no results for topic {topic!r} on device {device!r} in {store}; "
                          f"topics there: {topics(device, store)}")
    return [p for _, p in reversed(found)]


def read(path):
    """One results file: {"meta": {...}, "rows": [...]}, its schema checked (a fresh copy)."""
    return copy.deepcopy(_parsed(Path(path)))


@lru_cache(maxsize=None)
def _parsed(path):
    data = json.loads(path.read_text())
    missing = [k for k in META if k not in data.get("meta", {})]
    if missing or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: meta lacks {missing} or rows is not a list "
                         f"(docs/results/README.md gives the schema)")
    return data


def load(topic, device="h200", store=None):
    """The newest file of ``topic``: {"meta": {...}, "rows": [...], "path": Path}."""
    path = files(topic, device, store)[0]
    return {**read(path), "path": path}


def identity(row):
    """What a row ran (its fields that are neither floats nor None), as a hashable key."""
    return tuple(sorted((k, json.dumps(v)) for k, v in row.items()
                        if v is not None and not isinstance(v, float)))


def _matches(row, match):
    return all(k in row and row[k] == v for k, v in match.items())


def current(topic, device="h200", store=None):
    """Every current row of ``topic`` (newest file first; an identity a newer file measured is
    skipped in older ones) as :class:`Found`."""
    out, seen = [], set()
    for path in files(topic, device, store):
        data = read(path)
        ids = {identity(r) for r in data["rows"]}
        out += [Found(r, data["meta"], path) for r in data["rows"] if identity(r) not in seen]
        seen |= ids
    return out


def rows(topic, device="h200", store=None, **match):
    """The current rows of ``topic`` whose fields equal ``match`` (dicts, newest file first)."""
    return [f.row for f in current(topic, device, store) if _matches(f.row, match)]


def find(topic, key, device="h200", store=None, **match):
    """The newest row of ``topic`` with fields ``match`` and a number under ``key``."""
    for path in files(topic, device, store):
        data = read(path)
        for row in data["rows"]:
            if _matches(row, match) and isinstance(row.get(key), (int, float)):
                return Found(row, data["meta"], path)
    raise LookupError(f"no row of topic {topic!r} ({device}) has {match} and a number under "
                      f"{key!r}; its files: {[p.name for p in files(topic, device, store)]}")


def every(topic, key, device="h200", store=None, **match):
    """Every file's first row with fields ``match`` and a number under ``key``, newest first:
    the same measurement across runs (:class:`Found` each)."""
    out = []
    for path in files(topic, device, store):
        data = read(path)
        row = next((r for r in data["rows"]
                    if _matches(r, match) and isinstance(r.get(key), (int, float))), None)
        if row is not None:
            out.append(Found(row, data["meta"], path))
    return out


def same_run(found, **changes):
    """The row of ``found``'s run that differs from it only in ``changes`` (e.g. the peer timed
    in the same process: ``same_run(f, backend="mamba_ssm")``), as :class:`Found`."""
    want = {k: v for k, v in found.row.items() if v is not None and not isinstance(v, float)}
    want.update(changes)
    rows = [r for r in read(found.path)["rows"] if identity(r) == identity(want)]
    if not rows:
        raise LookupError(f"{found.path.name} has no row {want}")
    return Found(rows[0], found.meta, found.path)


def value(topic, key, device="h200", store=None, **match):
    """The number under ``key`` of :func:`find`'s row."""
    return find(topic, key, device, store, **match).row[key]


def source(path):
    """Device, date and file of a results file, the way the course cites a measurement."""
    meta, path = read(path)["meta"], Path(path)
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f"{meta['device']}, {meta['date']}, {where}"


def cite(topic, key, fmt=".3f", unit=" ms", device="h200", store=None, **match):
    """``"x.xxx ms (NVIDIA H200, 2026-12-01, docs/results/…json)"``: a number and its source."""
    f = find(topic, key, device, store, **match)
    return f"{f.row[key]:{fmt}}{unit} ({f.source})"
