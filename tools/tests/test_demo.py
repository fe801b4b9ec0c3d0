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
