import sys

from triton_dispatch.testing.imports import module_imports, mutual_imports


def test_mutual_imports_finds_a_circle_at_any_level(tmp_path, monkeypatch):
    pkg = tmp_path / "circle_pkg"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .ops import op\n")  # a package exporting: not a circle
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "op.py").write_text("from .plan import build\n")
    # the way back hides in a function and a type-checking block: still an import of op
    (pkg / "ops" / "plan.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import op\n"
        "def build():\n    from ..ops.op import thing\n"
    )
    (pkg / "ops" / "kernels.py").write_text("import circle_pkg.ops.plan\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("circle_pkg", None)
    assert mutual_imports("circle_pkg") == [("circle_pkg.ops.op", "circle_pkg.ops.plan")]
    assert module_imports("circle_pkg")["circle_pkg.ops.kernels"] == {"circle_pkg.ops.plan"}


def test_triton_dispatch_modules_import_one_way():
    assert mutual_imports("triton_dispatch") == []
