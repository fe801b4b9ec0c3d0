from repo_tools import demo


def test_only_with_an_unknown_package_is_an_error_naming_it_and_a_close_match(capsys, monkeypatch):
    known = ["late-interaction-kernels", "tomo-kplanes", "vq-kernels"]
    monkeypatch.setattr(demo, "kernel_packages", lambda: known)
    monkeypatch.setattr(demo, "registered_demos", dict)
    assert demo.main(["--only", "tomo-kplane"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "'tomo-kplane'" in err and "did you mean 'tomo-kplanes'?" in err
    assert "late-interaction-kernels, tomo-kplanes, vq-kernels" in err

    assert demo.main(["--only", "tomo-kplanes", "nothing-like-it"]) == 2
    err = capsys.readouterr().err
    assert "'nothing-like-it'" in err and "did you mean" not in err


def test_only_accepts_known_names_in_any_spelling(capsys, monkeypatch):
    monkeypatch.setattr(demo, "kernel_packages", lambda: ["tomo-kplanes", "vq-kernels"])
    monkeypatch.setattr(demo, "registered_demos", dict)
    assert demo.main(["--only", "tomo_kplanes"]) == 0
    out = capsys.readouterr().out
    assert "tomo-kplanes  no demo yet" in out and "vq-kernels" not in out


def test_unknown_package_message_is_none_when_every_name_is_known():
    assert demo.unknown_package_message(["vq_kernels"], ["vq-kernels"]) is None


class _EntryPoint:
    value = "fake:run"

    def __init__(self, fn):
        self.fn = fn

    def load(self):
        return self.fn


def test_each_demo_prints_one_line_and_its_own_output_goes_to_its_log(capsys, monkeypatch, tmp_path):
    from triton_dispatch import DemoResult

    def chatty(out_dir):
        print("loading the encoder")
        return DemoResult(summary="it ran", backend="torch", key_figure="1.0", outputs=[])

    def broken(out_dir):
        print("got this far")
        raise RuntimeError("boom")

    monkeypatch.setattr(demo, "kernel_packages", lambda: ["a-kernels", "b-kernels"])
    monkeypatch.setattr(
        demo, "registered_demos", lambda: {"a-kernels": _EntryPoint(chatty),
                                           "b-kernels": _EntryPoint(broken)}
    )  # fmt: skip
    assert demo.main(["--output-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("a-kernels  it ran | backend=torch | 1.0 | took ")
    assert lines[0].endswith(" s")
    assert "loading the encoder" not in out
    assert (tmp_path / "a-kernels" / demo.LOG_FILE).read_text() == "loading the encoder\n"
    # a failing demo shows what it printed, then its traceback
    assert lines[1].startswith("b-kernels  FAILED") and lines[2] == "got this far"
    assert "RuntimeError: boom" in err


def test_only_without_a_name_is_an_error_listing_the_known_names(capsys, monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(demo, "kernel_packages", lambda: ["tomo-kplanes", "vq-kernels"])
    monkeypatch.setattr(
        demo, "registered_demos", lambda: {"vq-kernels": _EntryPoint(lambda d: ran.append(d))}
    )
    assert demo.main(["--output-dir", str(tmp_path), "--only"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and ran == []
    assert err.count("\n") == 1
    assert "--only needs at least one package name" in err
    assert "known packages: tomo-kplanes, vq-kernels" in err
