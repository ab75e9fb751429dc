"""Scans of the recurrence h_t = Ā_t h_{t−1} + B̄_t x_t, from the obvious loop to chunked forms.

    sequential    selective_scan_sequential — the oracle (chapter 02)
    hillis_steele hillis_steele_scan        — depth log l, work l·log l (chapter 04)
    blelloch      blelloch_scan             — depth 2·log l, work O(l) (chapter 04)
    selective     selective_scan_parallel   — discretize → a scan above → C contraction (chapter 04)
    chunked       chunked_scan              — scans in chunks, carries between them (chapter 06)
"""

import importlib

_WHERE = {
    "selective_scan_sequential": "sequential",
    "linear_scan_sequential": "sequential",
    "selective_scan_parallel": "selective",
    "hillis_steele_scan": "hillis_steele",
    "blelloch_scan": "blelloch",
    "chunked_scan": "chunked",
}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
