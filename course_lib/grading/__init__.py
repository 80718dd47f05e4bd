"""Everything that grades, sandboxes or generates exercises; not part of any technique.

    cli.py                python -m course_lib.grade: one notebook, or a folder of them (a class)
    grade.py              score a submitted notebook against its source
    validate_notebook.py  check a notebook's JSON has the shape the grader relies on, before anything reads it
    classroom.py          grade a whole class in one command: parallel, resumable
    gradebook.py          what a class's grading leaves: gradebook, feedback per student, Gradescope results
    remote.py             the grader's side of the sandbox: start it, run cells, call answers as proxies
    answers.py            the sandbox's side: run the student's cells, answer calls with plain data
    wire.py               what crosses between them: pickle in, plain data (weights_only) out
    jail.py               run a command in Linux namespaces: read-only files, private /tmp, own PIDs, nobody
    zygote.py             `python -c` sandboxes forked (jailed, or not) from a process that imported torch
    zygote_server.py      ... that process itself: forks a child per request, which becomes a fresh python -c
    limits.py             resource limits (memory, CPU time, processes) for the processes of one submission
    environment.py        the allow-list of the grader's environment that student processes start from
    exercises.py          python -m course_lib.exercises: the student notebooks from solutions/
    catalog.py            ... and course_lib/learn/catalog.json beside them (the learner's help on Colab too)
    student.py            run a function written in a notebook cell on N ranks (launch_student)
    variants.py           per-student variants of the practica: parameters drawn from the student's id
    make_it_small.py      practicum "Make it small": the given model, measure, remeasure
    sandbox.py            the guarded child processes that run a make-it-small answer
    scale_out.py          practicum "Scale it out": the given single-process script (python -m)
    scale_out_harness.py  run a learner's DDP script under torchrun and read back what it did

The rule: technique modules (course_lib.*, course_lib.distributed.*, course_lib.compression.*, ...)
never import course_lib.grading; only the checks behind the notebooks (course_lib.checks) and the
two command-line entry modules course_lib.grade and course_lib.exercises do. grade and
exercises need the grading extra (nbformat, nbclient, nbgrader): pip install 'course_lib[grading]'.
"""
