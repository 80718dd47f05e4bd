"""The helpers every check module uses (course_lib.checks): calling an answer, and reading its code."""
import pytest

from course_lib.checks import call_answer, calls_function, code_tokens, library_call


def test_call_answer_passes_the_stub_through_and_names_any_other_error():
    assert call_answer(lambda a, b: a + b, 2, 3, what="add") == 5

    def stub(*args):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        call_answer(stub, 1, what="stub")
    with pytest.raises(AssertionError, match=r"^add\(1, 'x'\) raised TypeError: .*\. Hint: numbers only$"):
        call_answer(lambda a, b: a + b, 1, "x", what="add(1, 'x')", hint="Hint: numbers only")
    with pytest.raises(AssertionError, match=r"^f raised ZeroDivisionError: division by zero\.$"):
        call_answer(lambda: 1 / 0, what="f")


def test_calls_function_sees_dotted_and_bare_calls_only():
    assert calls_function("out = torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)", "quantize_per_tensor")
    assert calls_function("from torch import quantize_per_tensor as q", "quantize_per_tensor")
    assert calls_function("y = evaluate(model, loader)", "evaluate")
    assert not calls_function("def evaluate(model, loader):\n    return 0", "evaluate")
    assert not calls_function("# evaluate(model) would do it\ns = 'evaluate(x)'", "evaluate")
    assert not calls_function("evaluate = 3", "evaluate")
    assert not calls_function("def f(:\n", "evaluate")          # code that does not parse: nothing is called


def test_code_tokens_and_library_call_ignore_comments_and_strings():
    assert code_tokens("x = a.half()  # not torch.float16") == ["x", "=", "a", ".", "half", "(", ")"]
    assert code_tokens("") == []
    assert code_tokens("f(") == ["f", "("]                     # a source that ends mid-expression

    def uses_prune(w):
        from torch.nn.utils import prune
        return prune.l1_unstructured

    def own(w):
        """l1_unstructured is not allowed"""   # a string names it: that is not a use
        return w

    assert library_call(uses_prune, ["l1_unstructured"]) == "l1_unstructured"
    assert library_call(own, ["l1_unstructured"]) == ""
    assert library_call(own, methods=["own"]) == ""             # its own name, defined but not called
