import os

import pytest

from course_lib.data import find_mnist

os.environ.setdefault("TQDM_DISABLE", "1")

needs_mnist = pytest.mark.skipif(not find_mnist().ok, reason="MNIST not found: set COURSE_DATA_DIR")
