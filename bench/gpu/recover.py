"""Rebuild a device run's results files from its log, when the run was cut before it wrote them.

    python3 -m bench.gpu.recover LOG --command CMD --commit C --date D [--note TEXT] --out DIR

``bench.gpu.batch_one`` logs every row as ``[ t ] TOPIC key=value key=value …`` the moment it is
measured (floats to 4 significant digits); this reads those lines back into rows (strings,
integers and floats as the keys say) and writes one results file per topic through
`bench.gpu.record` — with the run's own command, commit and date, and a note saying the rows
came from the log.
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu import record  # noqa: E402

LINE = re.compile(r"^\[\s*[\d.]+s\] (\w+) (.*)$")
KEY = re.compile(r"(?:^| )([a-z_]+)=")
INTS = {"tokens", "b", "n", "pieces"}
STRINGS = {"op", "backend", "shape", "segments"}


def parse(text):
    """{topic: rows} from the logged row lines (other lines are skipped)."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m or "=" not in m.group(2):
            continue
        body = m.group(2)
        keys = list(KEY.finditer(body))
        row = {}
        for i, k in enumerate(keys):
            end = keys[i + 1].start() if i + 1 < len(keys) else len(body)
            value = body[k.end():end].strip()
            name = k.group(1)
            row[name] = value if name in STRINGS else int(value) if name in INTS else float(value)
        out.setdefault(m.group(1), []).append(row)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--command", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--device", default="NVIDIA H200")
    p.add_argument("--torch", default="2.11.0+cu130")
    p.add_argument("--triton", default="3.6.0")
    p.add_argument("--method", required=True)
    p.add_argument("--peers", default="mamba_ssm=2.3.2.post1")
    p.add_argument("--note", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    peers = dict(kv.split("=", 1) for kv in a.peers.split(",") if kv)
    for topic, rows in parse(Path(a.log).read_text()).items():
        meta = dict(device=a.device, date=a.date, command=a.command, commit=a.commit,
                    torch=a.torch, triton=a.triton, peers=peers, method=a.method,
                    baseline="mamba_ssm cuda" if topic == "batch_one" else "mamba_ssm",
                    note=("rows recovered from the run's log (each printed as measured, floats "
                          "to 4 significant digits) by bench/gpu/recover.py. " + a.note).strip())
        record.write(topic, rows, meta, a.out)


if __name__ == "__main__":
    main()
