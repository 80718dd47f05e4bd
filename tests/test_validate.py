import pytest

from course_lib.validate import positive_int


def test_positive_int_accepts_and_returns():
    assert positive_int("n", 3) == 3
    assert positive_int("limit", None, allow_none=True) is None


@pytest.mark.parametrize("bad", [0, -1, 2.0, "3", True, None])
def test_positive_int_refuses_by_name(bad):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        positive_int("batch_size", bad)
