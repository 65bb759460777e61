"""python/ferrocaffe/_native.pyi declares exactly what the compiled module exports."""

import ast
from pathlib import Path

import ferrocaffe
from ferrocaffe import _native

STUB = Path(ferrocaffe.__file__).with_name("_native.pyi")


def _stub_names() -> set[str]:
    tree = ast.parse(STUB.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_stub_and_module_export_the_same_names():
    exported = {n for n in dir(_native) if not n.startswith("_")} | {"__version__"}
    assert _stub_names() == exported


def test_stubbed_functions_are_callable_and_classes_are_classes():
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert callable(getattr(_native, node.name)), node.name
        elif isinstance(node, ast.ClassDef):
            cls = getattr(_native, node.name)
            assert isinstance(cls, type), node.name
            # A stub that derives from an exception class must be one at run time too.
            stub_bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if stub_bases & {"Exception", "ValueError", "RuntimeError", "KeyError"}:
                assert issubclass(cls, Exception), node.name
            # Stubbed methods exist on the class.
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                    assert callable(getattr(cls, item.name, None)), f"{node.name}.{item.name}"


def test_package_is_marked_typed():
    assert Path(ferrocaffe.__file__).with_name("py.typed").is_file()
