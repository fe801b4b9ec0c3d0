from repo_tools.kernel_share import kernel_lines, kernel_share


def test_counts_only_jitted_functions_with_their_decorators():
    source = (
        "import triton\n\n@triton.jit\ndef k(x):\n    return x\n\ndef host(x):\n    return k(x)\n"
    )
    assert kernel_lines(source) == 3


def test_sums_kernel_and_all_lines_per_package(tmp_path):
    ops = tmp_path / "packages" / "p" / "src" / "p" / "ops" / "a"
    ops.mkdir(parents=True)
    (ops / "kernels.py").write_text("@triton.jit\ndef k():\n    pass\n")
    (ops / "dispatch.py").write_text("def f():\n    pass\n")
    assert kernel_share(tmp_path) == {"p": (3, 5)}
