"""Show the library's real source in a lecture: `show_source(FlatDDP)` renders the class as highlighted code.

The lecture then checks that same object against PyTorch, so what the class reads is what runs.
Outside a notebook (a script, nbval's text comparison) the code is printed as plain text.
`interactive(fn, **controls)` puts a lecture's what-if function under sliders, and degrades to its output on
a published page.
"""
import inspect
import os
import textwrap


def source_of(obj, *, skip_docstring: bool = False) -> str:
    """The source text of a function, method, class or module (dedented); a `partial` shows its function."""
    target = getattr(obj, "func", obj)     # functools.partial
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)
            or inspect.ismodule(target)):
        raise TypeError(f"show_source: obj must be a function, method, class or module, got {type(obj).__name__}")
    text = textwrap.dedent(inspect.getsource(target))
    if skip_docstring and target.__doc__:
        lines = text.splitlines(keepends=True)
        doc_start = next(i for i, line in enumerate(lines) if '"""' in line or "'''" in line)
        quote = '"""' if '"""' in lines[doc_start] else "'''"
        end = doc_start if lines[doc_start].count(quote) >= 2 else next(
            i for i in range(doc_start + 1, len(lines)) if quote in lines[i])
        text = "".join(lines[:doc_start] + lines[end + 1:])
    return text


def show_source(*objs, skip_docstring: bool = False) -> None:
    """Display each object's source, highlighted in Jupyter, headed by the file and line it comes from."""
    if not objs:
        raise TypeError("show_source: give at least one function, method or class")
    for obj in objs:
        text = source_of(obj, skip_docstring=skip_docstring)
        target = getattr(obj, "func", obj)
        where = f"# {_module_path(target)}, line {inspect.getsourcelines(target)[1]}\n"
        try:
            from IPython import get_ipython
            from IPython.display import Code, display
            shell = get_ipython()
        except ImportError:
            shell = None
        if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
            display(Code(where + text, language="python"))
        else:
            print(where + text)


def _module_path(obj) -> str:
    """`course_lib/distributed/ddp.py`: the path inside the repository, not this machine's."""
    module = inspect.getmodule(obj)
    name = module.__name__ if module else "?"
    return name.replace(".", "/") + (".py" if not (module and module.__file__.endswith("__init__.py")) else "/__init__.py")


def interactive(fn, **controls):
    """`fn` under ipywidgets controls (sliders, text boxes) in Jupyter.

    A published page (COURSE_STATIC_PAGE=1, set by `make site`) has no kernel to call `fn` when a slider moves,
    so there the cell shows `fn`'s output for the controls' starting values and says what would be adjustable.
    """
    import ipywidgets as widgets

    if not callable(fn):
        raise TypeError(f"fn must be a function to call with the controls' values; got {type(fn).__name__}")
    if os.environ.get("COURSE_STATIC_PAGE", "") != "1":
        return widgets.interactive(fn, **controls)
    start = {name: c.value for name, c in controls.items() if isinstance(c, widgets.ValueWidget)}
    print(f"Interactive in Jupyter ({', '.join(controls)} adjustable); shown for "
          + ", ".join(f"{k}={v!r}" for k, v in start.items()) + ":")
    fn(**start)
    return None
