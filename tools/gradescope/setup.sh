#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image (with internet): it installs the
# course into /autograder/source/.venv and downloads MNIST there. Build the zip with make_zip.sh.
set -euo pipefail
cd /autograder/source
apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip > /dev/null
python3 -m venv .venv
.venv/bin/pip install -q -r requirements.txt
.venv/bin/pip install -q --no-deps -e .
COURSE_DATA_DIR=/autograder/source/data .venv/bin/python -m course_lib download
