"""Entry point only: `python -m course_lib.grade` runs course_lib.grading.cli.main (see that module)."""
import sys

from course_lib.grading.cli import main

if __name__ == "__main__":
    sys.exit(main())
