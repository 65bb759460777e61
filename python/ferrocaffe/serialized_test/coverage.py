"""Caffe2's ``serialized_test.coverage``: which operators the recorded serialized tests cover.

``gen_serialized_test_coverage(source_dir, output_dir)`` writes ``SerializedTestCoverage.md``
in ``output_dir``: the registered operators with a (public) schema that the records in
``source_dir`` run (the op and its gradient ops), those they do not, and the registered
operators without a schema.
"""

import os
import zipfile

from ferrocaffe import _native, workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = ["gen_coverage_sets", "gen_covered_ops", "gen_serialized_test_coverage"]


def _op_type(data):
    op = caffe2_pb2.OperatorDef()
    op.ParseFromString(data)
    return op.type


def gen_covered_ops(source_dir):
    """The op types recorded in the zips of ``source_dir`` (``op.pb`` and ``grad_<i>.pb``)."""
    covered = set()
    for name in os.listdir(source_dir):
        path = os.path.join(source_dir, name)
        if not os.path.isfile(path):
            continue
        with zipfile.ZipFile(path) as z:
            files = set(z.namelist())
            covered.add(_op_type(z.read("op.pb")))
            index = 0
            while f"grad_{index}.pb" in files:
                covered.add(_op_type(z.read(f"grad_{index}.pb")))
                index += 1
    return covered


def gen_coverage_sets(source_dir):
    """``(covered, not covered, schemaless)``: covered op types; registered ops with a public
    schema that are not covered; registered ops without a schema."""
    covered = gen_covered_ops(source_dir)
    not_covered = set()
    schemaless = []
    for op_type in workspace.RegisteredOperators():
        schema = _native.op_schema(op_type)
        if schema is None:
            if "_ENGINE_" not in op_type:
                schemaless.append(op_type)
        elif not schema.get("private", False) and op_type not in covered:
            not_covered.add(op_type)
    return covered, not_covered, schemaless


def _section(title, summary, names):
    lines = [title, "<details>", f"<summary>{summary}</summary>", ""]
    lines += ["* " + n for n in sorted(names)]
    return lines + ["</details>", ""]


def gen_serialized_test_coverage(source_dir, output_dir):
    """Writes ``<output_dir>/SerializedTestCoverage.md`` for the records in ``source_dir``."""
    covered, not_covered, schemaless = gen_coverage_sets(source_dir)
    total = len(covered) + len(not_covered)
    share = int(len(covered) / total * 1000) / 10 if total else 0.0
    lines = [
        "# Serialized Test Coverage Report",
        "This is an automatically generated file.",
        "## Summary",
        f"Serialized tests have covered {len(covered)}/{total} ({share}%) operators",
        "",
    ]
    lines += _section(
        "## Not covered operators",
        f"There are {len(not_covered)} not covered operators",
        not_covered,
    )
    lines += _section(
        "## Covered operators", f"There are {len(covered)} covered operators", covered
    )
    lines += ["## Excluded from coverage statistics"]
    lines += _section(
        "### Schemaless operators",
        f"There are {len(schemaless)} schemaless operators",
        schemaless,
    )
    with open(os.path.join(output_dir, "SerializedTestCoverage.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
