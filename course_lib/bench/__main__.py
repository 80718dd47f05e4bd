"""`python -m course_lib.bench NAME [--data-dir D] [--quick] [--json]`: run one benchmark, print its table.

Exit status 2, with `error: ...` on stderr, for an unknown name or missing MNIST.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import BENCHMARKS, __doc__ as PACKAGE_DOC, run_benchmark
from .result import format_table


def build_parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<12} {b.description}" for name, b in sorted(BENCHMARKS.items()))
    p = argparse.ArgumentParser(prog="python -m course_lib.bench", description=PACKAGE_DOC.split("\n\n")[0],
                                epilog="benchmarks:\n" + listing, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help=f"which benchmark: {', '.join(sorted(BENCHMARKS))}")
    p.add_argument("--data-dir", default=None, help="MNIST root (default: $COURSE_DATA_DIR, else ~/.cache/course_lib/data)")
    p.add_argument("--quick", action="store_true", help="fewer samples and epochs (for tests)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    return p


def main(argv=None) -> int:
    from ..data import MNISTNotFoundError

    args = build_parser().parse_args(argv)
    try:
        result = run_benchmark(args.name, args.data_dir, args.quick)
    except (ValueError, MNISTNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"\n{result.title}\n{format_table(result.rows)}")
    if "speedup" in result.summary:
        extra = (f", {result.summary['speedup_vs_workers2']}x vs 2 workers"
                 if "speedup_vs_workers2" in result.summary else "")
        print(f"speedup: {result.summary['speedup']}x{extra}")
    if args.json:
        print(json.dumps(result.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
