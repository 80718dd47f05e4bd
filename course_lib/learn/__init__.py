"""A learner alone with the course: what they have done, help that grows with each failed check, and the
solution once earned. Nothing here leaves the machine, and no grade reads it.

    catalog.py   the exercises as data (catalog.json, generated from solutions/ by python -m course_lib.exercises)
    record.py    the learner's progress file: where it lives, atomic and locked writes, COURSE_PROGRESS=off
    report.py    python -m course_lib progress: the table, the next exercise, reset, minutes per exercise
    hints.py     the tiers of help per exercise (hints/nbNN.json): the concept, then the lecture section
    hook.py      in a Jupyter kernel: records each check cell's outcome and shows the next tier
    reveal.py    the solution beside the learner's answer as a diff, after a pass or 3 failed checks
    workcopy.py  python -m course_lib work: the learner's copy of exercises/ in work/ (make lab), brought up to
                 date beside their answers
"""
