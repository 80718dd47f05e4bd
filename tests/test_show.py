"""course_lib.show: a lecture displays the library's real source, headed by where it lives."""
import functools

import pytest

from course_lib.distributed import ddp
from course_lib.show import interactive, show_source, source_of


def test_source_is_the_real_code_with_its_repository_path(capsys):
    show_source(ddp.FlatDDP)
    out = capsys.readouterr().out
    assert out.startswith("# course_lib/distributed/ddp.py, line ")
    assert "class FlatDDP(nn.Module):" in out and "dist.all_reduce(flat)" in out
    assert "/work" not in out and "site-packages" not in out


def test_methods_are_dedented_docstrings_can_be_skipped_and_partials_show_their_function():
    text = source_of(ddp.FlatDDP.sync_gradients)
    assert text.startswith("def sync_gradients(self)")
    short = source_of(ddp.FlatDDP, skip_docstring=True)
    assert '"""' not in short.splitlines()[1] and "def sync_gradients" in short
    assert source_of(functools.partial(ddp.shard_indices, 10)).startswith("def shard_indices(")


def test_bad_input_says_what_is_allowed():
    with pytest.raises(TypeError, match="function, method, class or module"):
        source_of(3)
    with pytest.raises(TypeError, match="at least one"):
        show_source()


def test_interactive_is_a_widget_in_jupyter_and_its_starting_output_on_a_static_page(monkeypatch, capsys):
    import ipywidgets as widgets

    calls = []

    def what_if(x=1.0, link="a"):
        calls.append((x, link))
        print(f"x={x} link={link}")

    monkeypatch.delenv("COURSE_STATIC_PAGE", raising=False)
    assert isinstance(interactive(what_if, x=widgets.FloatSlider(value=2.0), link=["a", "b"]), widgets.interactive)
    calls.clear()
    monkeypatch.setenv("COURSE_STATIC_PAGE", "1")
    assert interactive(what_if, x=widgets.FloatSlider(value=2.0), link=["a", "b"]) is None
    assert calls == [(2.0, "a")]   # the slider's start; a list abbreviation leaves the function's default
    out = capsys.readouterr().out
    assert "x, link adjustable" in out and "x=2.0 link=a" in out
    with pytest.raises(TypeError, match="fn must be a function"):
        interactive(3, x=widgets.FloatSlider(value=2.0))
