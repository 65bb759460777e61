"""Figures of a Caffe2 suite run (the runner's --json output), per group, with and without the
tests listed in tests/caffe2_suite_exceptions.toml, and the files' wall time against Caffe2's.

    python scripts/caffe2_suite_report.py RUN.json --census CENSUS.json --mode own|upstream

An exception applies when its `mode` (if any) is this run's and its `numpy` condition (if any,
e.g. ">=2" or ">=1.23") holds for the numpy of the Python running this script (run it with the
Python the suite ran with). Exceptions are only subtracted from the tests that failed; one that
passes is reported, since its entry is then out of date. Files the run did not include
(`--files`) are left out of every figure.
"""

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

import numpy as np

EXCEPTIONS = Path(__file__).resolve().parent.parent / "tests" / "caffe2_suite_exceptions.toml"


def version_tuple(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def numpy_condition_holds(cond, version):
    """`cond` as ">=2", "<1.23" ...: whether `version` (a tuple) satisfies it."""
    m = re.fullmatch(r"\s*(>=|<=|>|<|==)\s*([\d.]+)\s*", cond)
    if not m:
        raise ValueError(f"numpy condition {cond!r}: expected an operator and a version")
    op, want = m.group(1), version_tuple(m.group(2))
    have = version[: len(want)]
    return {
        ">=": have >= want,
        "<=": have <= want,
        ">": have > want,
        "<": have < want,
        "==": have == want,
    }[op]


def applicable_exceptions(entries, mode, numpy_version):
    """{(file, test id): reason} of the entries that apply to this run."""
    out = {}
    for e in entries:
        if e.get("mode") not in (None, mode):
            continue
        if "numpy" in e and not numpy_condition_holds(e["numpy"], numpy_version):
            continue
        for t in e["tests"]:
            out[(e["file"], t)] = e["reason"]
    return out


def seconds(tail):
    m = re.search(r"in ([\d.]+)s", tail or "")
    return float(m.group(1)) if m else None


def report(run, census, exceptions):
    lines = []
    groups = {}
    stale = []
    wall, wall_c2, missing_time = 0.0, 0.0, []
    for name, info in sorted(census["files"].items()):
        if name not in run["files"]:
            continue  # not run this time (--files)
        group = groups.setdefault(info["selection"], {"peer": 0, "pass": 0, "excused": 0})
        peer = set(info["passed_ids"])
        got = run["files"][name]
        passed = set(got["passed"])
        group["peer"] += len(peer)
        group["pass"] += len(peer & passed)
        for t in sorted(peer - passed):
            if (name, t) in exceptions:
                group["excused"] += 1
        for t in sorted(peer & passed):
            if (name, t) in exceptions:
                stale.append(f"{name}::{t}")
        wall_c2 += info["seconds_median"]
        s = seconds(got["tail"])
        if s is None:
            missing_time.append(name)
        else:
            wall += s
    for g, c in sorted(groups.items()):
        base = c["peer"] - c["excused"]
        lines.append(
            f"{g}: {c['pass']}/{c['peer']} ({100.0 * c['pass'] / max(c['peer'], 1):.1f}%); "
            f"without the {c['excused']} listed exceptions {c['pass']}/{base} "
            f"({100.0 * c['pass'] / max(base, 1):.1f}%)"
        )
    lines.append(
        f"wall time (pytest's per-file seconds, summed): {wall:.1f} s here, "
        f"{wall_c2:.1f} s on Caffe2 (ratio {wall / wall_c2:.2f})"
        + (f"; no time for {', '.join(missing_time)}" if missing_time else "")
    )
    for t in stale:
        lines.append(f"listed as an exception but passes: {t}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="the runner's --json output")
    ap.add_argument("--census", required=True)
    ap.add_argument("--mode", choices=["own", "upstream"], required=True)
    ap.add_argument("--exceptions", default=str(EXCEPTIONS))
    args = ap.parse_args(argv)
    run = json.loads(Path(args.run).read_text())
    census = json.loads(Path(args.census).read_text())
    entries = tomllib.loads(Path(args.exceptions).read_text())["exception"]
    exc = applicable_exceptions(entries, args.mode, version_tuple(np.__version__))
    print(f"numpy {np.__version__}, mode {args.mode}:")
    for line in report(run, census, exc):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
