"""`python -m course_lib doctor`: is this machine ready for the course?
`python -m course_lib download`: fetch MNIST into $COURSE_DATA_DIR (else ~/.cache/course_lib/data) for offline use.
`python -m course_lib progress [--reset X | --medians FILE... [--apply]]`: your exercises, passed / tried / not started
(course_lib.learn.report).
`python -m course_lib work create|status|update`: your own copy of the exercises in work/, brought up to date
beside your answers after a `git pull` (course_lib.learn.workcopy).
"""
import argparse
import sys

from .env import doctor


def download() -> int:
    from .data import MNISTNotFoundError, data_root, find_mnist, mnist_dataset

    try:
        for split in ("train", "test"):
            mnist_dataset(split)
    except MNISTNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"MNIST is ready: {find_mnist().summary} (root {data_root()})")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["progress"]:          # its own options (course_lib.learn.report)
        from .learn.report import main as progress
        return progress(argv[1:])
    if argv[:1] == ["work"]:              # the learner's working copy (course_lib.learn.workcopy)
        from .learn.workcopy import main as work
        return work(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m course_lib")
    parser.add_argument("command", choices=["doctor", "download", "progress", "work"],
                        help="doctor: report the environment and what is missing; download: fetch MNIST; "
                             "progress: your exercises (progress --help); work: your copy of the exercises "
                             "(work --help)")
    args = parser.parse_args(argv)
    return doctor() if args.command == "doctor" else download()


if __name__ == "__main__":
    sys.exit(main())
