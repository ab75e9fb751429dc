"""The pass counts of ``bench/gpu/verify.sh``, from its JUnit XML files, as a results file.

    python3 -m bench.gpu.verify_summary LOGDIR OUTDIR --command CMD --seconds S

One row per part (notebooks, tests, each memory-hungry file): passed, failed, errors, skipped
(floats: the store's measurements), and the first failures by name. Prints a table; exit status 1
if anything failed or a part left no XML (it was killed at its time limit).
"""

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.gpu.record import record


def counts(xml_path):
    """(passed, failed, errors, skipped, [names of failed or erroring cases]) of one JUnit file."""
    root = ET.parse(xml_path).getroot()
    cases = root.iter("testcase")
    passed = failed = errors = skipped = 0
    bad = []
    for case in cases:
        kinds = {child.tag for child in case}
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if "failure" in kinds:
            failed += 1
            bad.append(name)
        elif "error" in kinds:
            errors += 1
            bad.append(name)
        elif "skipped" in kinds:
            skipped += 1
        else:
            passed += 1
    return passed, failed, errors, skipped, bad


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir")
    ap.add_argument("outdir")
    ap.add_argument("--command", required=True)
    ap.add_argument("--seconds", type=float, required=True)
    a = ap.parse_args(argv)
    rows, ok = [], True
    parts = [p for p in ("notebooks", "tests") if (Path(a.logdir) / f"{p}.log").exists()]
    parts += sorted(p.stem for p in Path(a.logdir).glob("hungry_*.log"))
    for part in parts:
        xml = Path(a.logdir) / f"{part}.xml"
        if not xml.exists():
            rows.append({"part": part, "status": "no XML: killed at its time limit"})
            ok = False
            continue
        p, f, e, s, bad = counts(xml)
        ok &= f == 0 and e == 0 and p > 0
        rows.append({"part": part, "passed": float(p), "failed": float(f), "errors": float(e),
                     "skipped": float(s), "first_failures": "; ".join(bad[:8])})
    record("verify", rows, command=a.command, peers={}, out_dir=a.outdir,
           method="pytest --nbval-lax over notebooks/ and solutions/, pytest over tests/ on the "
                  "GPU (tooling tests excluded: see bench/gpu/verify.sh), JUnit XML counts",
           seconds=a.seconds)
    print(f"{'part':28s} {'passed':>7s} {'failed':>7s} {'errors':>7s} {'skipped':>7s}")
    for r in rows:
        if "passed" in r:
            print(f"{r['part']:28s} {r['passed']:7.0f} {r['failed']:7.0f} {r['errors']:7.0f} "
                  f"{r['skipped']:7.0f}  {r['first_failures'][:150]}")
        else:
            print(f"{r['part']:28s} {r['status']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
