"""`python -m course_lib doctor`: is this machine ready for the course?"""
import argparse
import sys

from .env import doctor


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib")
    parser.add_argument("command", choices=["doctor"], help="doctor: report the environment and what is missing")
    parser.parse_args(argv)
    return doctor()


if __name__ == "__main__":
    sys.exit(main())
