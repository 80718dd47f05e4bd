"""Checks behind the exercise notebooks: one module per lecture (`nb01`, `nb02`, ...).

A check calls the learner's function on chosen cases and raises AssertionError with a message
that says what was wrong and hints at why, so an exercise answers "right?" at once. Each check
must fail on the untouched stub and on plausible wrong answers (tests/test_checks_*.py prove
it). Checks compare against PyTorch's own operations or known properties, not a copy of the
solution.
"""
from __future__ import annotations

import inspect
import io
import tokenize

import torch


def expect(condition: bool, message: str) -> None:
    """Raise AssertionError(message) unless `condition`."""
    if not condition:
        raise AssertionError(message)


def expect_close(actual, expected, what: str, atol: float = 1e-6, rtol: float = 1e-5, hint: str = "") -> None:
    """Tensors/numbers `actual` and `expected` agree within tolerance, else a message naming `what`."""
    actual_t, expected_t = torch.as_tensor(actual), torch.as_tensor(expected)
    expect(actual_t.shape == expected_t.shape,
           f"{what}: expected shape {tuple(expected_t.shape)}, got {tuple(actual_t.shape)}. {hint}".strip())
    ok = torch.allclose(actual_t.double(), expected_t.double(), atol=atol, rtol=rtol)
    if not ok:
        diff = (actual_t.double() - expected_t.double()).abs().max().item()
        raise AssertionError(f"{what}: max difference {diff:.3g} is above tolerance. {hint}".strip())


def torch_quantized(x: torch.Tensor, scale: float, zero_point: int, qmin: int, qmax: int):
    """(integer codes as int64, dequantized values): PyTorch's affine quantization of `x` to [qmin, qmax].

    torch.fake_quantize_per_tensor_affine returns only the dequantized values (code - zero_point) * scale;
    the codes are read back from them (dividing by the scale lands on the integer, which round makes exact).
    """
    fake = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)
    return torch.round(fake / scale).to(torch.int64) + zero_point, fake


def run_on_ranks(worker, world_size: int, fn, hung: str, timeout: float = 90) -> list:
    """`worker(rank, world_size, fn)` on `world_size` gloo ranks with the learner's `fn` (by its source, in the
    grading sandbox when graded); returns each rank's result. A rank's error becomes an AssertionError with its
    last lines, the untouched stub NotImplementedError, and a hang an AssertionError that says `hung`."""
    from ..distributed.launch import WorkerError
    from ..grading.remote import StudentError
    from ..grading.student import launch_source
    try:
        return launch_source(worker, world_size, fn, timeout=timeout)
    except TimeoutError:
        pass
    except (WorkerError, StudentError) as e:   # StudentError: the launch ran in the grading sandbox
        trace = getattr(e, "remote_traceback", None) or f"{e}\n{getattr(e, 'traceback', '')}"
        if "NotImplementedError" in trace:
            raise NotImplementedError(f"{fn.__name__} is still the stub") from None
        if "TimeoutError" not in trace.strip().splitlines()[0]:
            tail = "\n".join(str(e).strip().splitlines()[-4:])
            raise AssertionError(f"on {world_size} ranks, {tail}") from None
    raise AssertionError(f"on {world_size} ranks the ranks hung: {hung}")


def call_answer(fn, *args, what: str, hint: str = ""):
    """fn(*args): the learner's code. The stub's NotImplementedError passes through; any other exception is
    the answer's (a shape error from a wrong dim is a wrong answer, not a crashed check) and becomes an
    AssertionError that says where it happened."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{what} raised {type(exc).__name__}: {exc}. {hint}".strip()) from None


def answer_source(fn) -> str:
    """The code of the learner's answer: what a grader's proxy carries (`.source`, its answer cells) or a local
    function's own source; "" when neither can be read (then a check judges by behaviour alone)."""
    from ..grading.remote import is_remote
    if is_remote(fn):
        return fn.source or ""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def calls_method(source: str, name: str) -> bool:
    """Whether `source` calls `.name(` (torch.chunk(...), x.chunk(...)) or imports `name`; comments and strings
    do not count, nor a variable that merely has the name (`for chunk in chunks`)."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type in (tokenize.NAME, tokenize.OP)]
    except (tokenize.TokenError, SyntaxError):
        return False
    text = [t.string for t in tokens]
    return any(text[i] == name and ((i and text[i - 1] == "." and text[i + 1:i + 2] == ["("])
                                    or tokens[i].line.lstrip().startswith(("import ", "from ")))
               for i in range(len(text)))


def calls_function(source: str, name: str) -> bool:
    """Whether `source` calls `name` dotted (calls_method) or bare, as `name(...)` after a `from ... import name`
    in another cell; a `def name(` does not count."""
    if calls_method(source, name):
        return True
    try:
        tokens = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type in (tokenize.NAME, tokenize.OP)]
    except (tokenize.TokenError, SyntaxError):
        return False
    return any(tok == name and tokens[i + 1:i + 2] == ["("] and (i == 0 or tokens[i - 1] not in ("def", "."))
               for i, tok in enumerate(tokens))


def code_tokens(source: str) -> list:
    """The NAME and OP tokens of `source`, as far as it tokenizes (a lambda's source line may end mid-expression)."""
    out = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            if t.type in (tokenize.NAME, tokenize.OP):
                out.append(t.string)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return out


def library_call(fn, names=(), methods=()) -> str:
    """The first of `names` that the answer's code uses as a name (called, imported, or an attribute), or of
    `methods` that it calls as `.name(` or imports (names that are also the exercise's own function); "" if none.
    Comments and strings do not count."""
    source = answer_source(fn)
    used = set(code_tokens(source))
    return next((n for n in names if n in used), "") or next((m for m in methods if calls_method(source, m)), "")


def passed(name: str) -> None:
    """Print the line a learner looks for after a check."""
    print(f"\u2714 {name}: all checks passed")


def _learning_hook() -> None:
    """In a learner's Jupyter kernel, record each exercise check and show the next hint (course_lib.learn.hook);
    elsewhere (the grader, scripts) nothing."""
    from ..learn.hook import install
    install()


_learning_hook()
