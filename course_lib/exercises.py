"""Entry point only: `python -m course_lib.exercises` runs course_lib.grading.exercises.main (see that module)."""
import sys

from course_lib.grading.exercises import main

if __name__ == "__main__":
    sys.exit(main())
