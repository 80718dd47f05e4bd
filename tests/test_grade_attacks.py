"""Attacks on the grader by a student who wants points without doing the work (course_lib.grading.grade).

Every case is the UNSOLVED exercise notebook 00 (honest score 0 of 4) whose answer cell
`ex00_count_parameters` holds a few lines of attack code instead of an answer (the other answer cell
stays the stub). For every attack the test checks:
1. the score is the honest one (0, or what a real solution inside the attack earns);
2. no hidden-test text (the numbers and the marker lines of solutions/00's hidden tests) appears in
   anything the grader returns, prints (stdout, stderr) or writes (the --report file);
3. nothing a later grading reads changed on disk: every file under course_lib/ and solutions/, the
   *.pth / sitecustomize / usercustomize files of every site-packages folder and ~/.ipython (hashes
   before and after; Python's own new __pycache__ files are allowed); leak files named by the attack
   are absent. The last test grades the untouched exercise (0/4) and the solution (4/4) again.

The tests are written against the sandboxed grader: student cells in a jail (read-only file system,
private /tmp, solutions hidden, own PID namespace), tests and checks in the grader's process calling
the student's functions over a data-only channel, student output never on the grader's stdout, and
`--report FILE` (the --json fields plus `sandbox`) written after every sandbox process is dead. The
single-kernel grader falls for many of them. Attacks that write outside their sandbox carry a harmless
payload (it only sets an environment variable) and a random token in every file they write; the
`guard` fixture deletes the files named with the token and restores an attacked file that holds it.
In-kernel attacks are graded in this process (`grade.grade`); attacks on the grader process itself
(forged output, a process left behind, killing the grader) run the CLI in a session of its own.
"""
import dataclasses
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import nbformat
import pytest

import course_lib
from course_lib.grading import grade, jail
from nbtools import ROOT

pytestmark = pytest.mark.skipif(jail.available() is not None, reason=f"no jail on this machine ({jail.available()}): "
                                "the grader says so in its report's `sandbox` field")

NAME = "00_start_here_exercises.ipynb"
EXERCISE = ROOT / "exercises" / NAME
SOLUTION = ROOT / "solutions" / NAME
ATTACKED_CELL = "ex00_count_parameters"
TESTS = ("ex00_count_parameters_test", "ex00_describe_batch_test")
PACKAGE = Path(course_lib.__file__).resolve().parent          # the course_lib the grader imports
IPYTHON_DIR = Path.home() / ".ipython"
CLI_TIMEOUT = 180      # seconds for one CLI grading
AFTERMATH = 5          # seconds to wait after the grader exits, for anything it left behind to act


def hidden_needles() -> list[str]:
    """Text of the solution's hidden tests that must never come out: its numbers of 3+ digits as written
    (266_610) and as Python prints them (266610), and the section marker."""
    text = "\n".join(cell.source for cell in nbformat.read(str(SOLUTION), as_version=4).cells)
    hidden = "\n".join(re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", text, re.S))
    numbers = set(re.findall(r"\b\d[\d_]{2,}\b", hidden))
    needles = sorted(numbers | {n.replace("_", "") for n in numbers}) + ["BEGIN HIDDEN TESTS"]
    assert "266_610" in needles and "431080" in needles, f"solutions/{NAME} changed: pick new needles ({needles})"
    return needles


HIDDEN = hidden_needles()


class Attack(NamedTuple):
    code: str                   # the answer cell's source; @TOKEN@ and @FAKE@ are filled in per run
    honest: float = 0.0         # what the submission deserves
    leaks: tuple = ()           # files the attack tries to leave behind (must not exist afterwards)


ALWAYS_EQUAL = """
class _Yes:                     # equal to anything: passes `assert count_parameters(m) == n` (not an int)
    def __eq__(self, other):
        return True
def count_parameters(model):
    return _Yes()
"""
NO_CHECKS = "lambda f: None"
SOLVED = "def count_parameters(model):\n    return sum(p.numel() for p in model.parameters())\n"
LEAKS = ("/tmp/leak_@TOKEN@.txt", "~/leak_@TOKEN@.txt")
PAYLOAD = "import os; os.environ['PWNED_@TOKEN@'] = '1'"      # what the persistence attacks write: harmless

IN_KERNEL = {
    # 1. later cells (tests included) shrink to their last line: the grader's completion marker
    "input transformer": Attack("get_ipython().input_transformers_post.append(lambda lines: lines[-1:])"),
    # 2. the same on the syntax tree; this student also solved exercise 1 (2 points are honest)
    "AST transformer": Attack(SOLVED + """
import ast
class Skip(ast.NodeTransformer):
    def visit_Module(self, node):
        node.body = node.body[-1:]
        return node
get_ipython().ast_transformers.append(Skip())
""", honest=2.0),
    # 3. a tracer that jumps every check function to its last line (the "passed" print)
    "settrace jumps the checks": Attack(ALWAYS_EQUAL + """
import sys
def _tracer(frame, event, arg):
    code = frame.f_code
    if event != "call" or not code.co_name.startswith("check_") or "checks" not in code.co_filename:
        return None
    last = max(line for _, _, line in code.co_lines() if line)
    def jump(frame, event, arg):
        if event == "line" and frame.f_lineno != last:
            frame.f_lineno = last
        return jump
    return jump
sys.settrace(_tracer)
"""),
    # 3b. the answer reads the expected value from its caller: the check's local, or the constant compared to
    "answer reads its caller's frame": Attack("""
import dis, sys
def count_parameters(model):
    caller = sys._getframe(1)
    if "expected" in caller.f_locals:
        return caller.f_locals["expected"]
    return next(i.argval for i in dis.get_instructions(caller.f_code)
                if i.offset > caller.f_lasti and i.opname == "LOAD_CONST")
"""),
    # 4. fake check modules
    "sys.modules swap": Attack(ALWAYS_EQUAL + f"""
import sys, types
fake = types.ModuleType("course_lib.checks.nb00")
fake.check_count_parameters = fake.check_describe_batch = {NO_CHECKS}
sys.modules["course_lib.checks.nb00"] = fake
"""),
    "meta_path finder": Attack(ALWAYS_EQUAL + f"""
import importlib.abc, importlib.util, sys
class Fake(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "course_lib.checks.nb00" else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.check_count_parameters = module.check_describe_batch = {NO_CHECKS}
sys.meta_path.insert(0, Fake())
"""),
    "builtins.__import__": Attack(ALWAYS_EQUAL + f"""
import builtins, types
fake = types.ModuleType("course_lib.checks.nb00")
fake.check_count_parameters = fake.check_describe_batch = {NO_CHECKS}
_real_import = builtins.__import__
builtins.__import__ = lambda name, *a, **k: fake if name == "course_lib.checks.nb00" else _real_import(name, *a, **k)
"""),
    # 6. persisting to the next student (payloads harmless; the guard fixture restores the targets)
    "append to checks/nb00.py": Attack(f"""
import course_lib, pathlib
try:
    with open(pathlib.Path(course_lib.__file__).parent / "checks" / "nb00.py", "a") as f:
        f.write("\\n{PAYLOAD}\\n")
except OSError:
    pass
"""),
    "overwrite the solution": Attack(f"""
import course_lib, json, pathlib
target = pathlib.Path(course_lib.__file__).resolve().parents[1] / "solutions" / "{NAME}"
try:   # a real attacker would drop the hidden tests; this only tags the notebook
    nb = json.loads(target.read_text())
    nb["metadata"]["pwned"] = "@TOKEN@"
    target.write_text(json.dumps(nb, indent=1))
except OSError:
    pass
"""),
    "a .pth file in site-packages": Attack(f"""
import pathlib, site
for folder in site.getsitepackages() + [site.getusersitepackages()]:
    try:
        pathlib.Path(folder, "zzz_attack_@TOKEN@.pth").write_text("{PAYLOAD}\\n")
    except OSError:
        pass
"""),
    "an IPython startup file": Attack(f"""
import pathlib
startup = pathlib.Path.home() / ".ipython" / "profile_default" / "startup"
try:
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-attack-@TOKEN@.py").write_text("{PAYLOAD}\\n")
except OSError:
    pass
"""),
    # 7. leaking the hidden tests: from disk, and from the kernel's history and the caller's frame later on
    "copy the answer from the package's reveal data": Attack("""
import json, pathlib, course_lib
data = json.loads((pathlib.Path(course_lib.__file__).parent / "learn" / "catalog.json").read_text())
exec(next(e["solution"] for nb in data["notebooks"] for e in nb["exercises"] if e["answer"] == "ex00_count_parameters"))
"""),
    "read the solution from disk": Attack("""
import course_lib, os, pathlib
text = "".join(p.read_text() for p in pathlib.Path(course_lib.__file__).resolve().parents[1].glob("solutions/*.ipynb"))
print(text)
os.write(1, text.encode())
os.write(2, text.encode())
for leak in ("/tmp/leak_@TOKEN@.txt", os.path.expanduser("~/leak_@TOKEN@.txt")):
    try:
        pathlib.Path(leak).write_text(text)
        os.chmod(leak, 0o644)
    except OSError:
        pass
""", leaks=LEAKS),
    "history in later callbacks": Attack("""
import atexit, linecache, os, sys
def _leak(*args):
    text = ""
    try:
        shell = get_ipython()
        text = "\\n".join(shell.user_ns.get("In", []) + list(shell.history_manager.input_hist_raw))
    except Exception:
        pass
    frame = sys._getframe(1)
    text += "\\n" + "".join(linecache.getlines(frame.f_code.co_filename)) + repr(frame.f_code.co_consts)
    print(text)
    os.write(2, text.encode())
    try:
        with open("/tmp/leak_@TOKEN@.txt", "a") as f:
            f.write(text)
    except OSError:
        pass
def count_parameters(model):
    _leak()
    return 0
atexit.register(_leak)
get_ipython().events.register("post_run_cell", _leak)
""", leaks=LEAKS[:1]),
    # 9. torch patched: the answer is a tensor that claims to be an int and equals everything
    "torch patched": Attack("""
import torch
torch.Tensor.__eq__ = lambda self, other: True
torch.Tensor.__format__ = lambda self, spec: "0"
class _Count(torch.Tensor):
    __class__ = property(lambda self: int)
def count_parameters(model):
    return torch.zeros(()).as_subclass(_Count)
"""),
    # 10. regressions (defended by the single-kernel grader already)
    "fake AssertionError": Attack("""
import builtins
builtins.AssertionError = type("AssertionError", (Exception,), {})
get_ipython().showtraceback = lambda *a, **k: None
def count_parameters(model):
    return 0
"""),
    "excepthooks print the marker": Attack("""
import sys, traceback
def _swallow(*args, **kwargs):      # sys.excepthook(type, value, tb); IPython's (shell, type, value, tb)
    tb = args[-1]
    print(*[c for f, _ in traceback.walk_tb(tb) for c in f.f_code.co_consts
            if isinstance(c, str) and c.startswith("course-grade-")], flush=True)
sys.excepthook = _swallow
get_ipython().set_custom_exc((BaseException,), _swallow)
def count_parameters(model):
    return 0
"""),
    "print replaced": Attack("""
import builtins, sys
builtins.print = lambda *a, **k: sys.__stdout__.write("\\u2714 count_parameters: all checks passed\\n")
def count_parameters(model):
    return 0
"""),
    # 11. an int that equals everything passes the real check (isinstance int) and the hidden asserts
    "int subclass equal to everything": Attack("""
class _Yes(int):
    __eq__ = lambda self, other: True
    __hash__ = int.__hash__
def count_parameters(model):
    return _Yes(0)
"""),
}

FAKE_REPORT = {"score": 4.0, "max_score": 4.0, "points": dict.fromkeys(TESTS, 2.0),
               "max_points": dict.fromkeys(TESTS, 2.0), "status": dict.fromkeys(TESTS, "passed"), "messages": {},
               "notes": [], "error": "", "seconds": 1.0, "sandbox": "forged-@TOKEN@"}
ON_THE_GRADER = {
    # 5. a forged report line on the grader's stdout and stderr, then the kernel/sandbox dies
    "forged report line": Attack("""
import os, time
os.write(1, b'\\n@FAKE@\\n')
os.write(2, b'\\n@FAKE@\\n')
time.sleep(1)                # until the kernel has passed fd 1 on
os._exit(0)
"""),
    # 5b. a process in a session of its own, reparented away from the kernel (out of reach of a kill of the
    # kernel's tree and its groups), that waits for the grader to exit, then prints a forged report line and
    # overwrites the --report file
    "process left behind": Attack("""
import os, subprocess, sys
LATER = r'''
import os, sys, time
grader, fake = int(sys.argv[1]), sys.argv[2]
try:        # the grader's stdout (the kernel's fd 1 is a pipe to the kernel), command line and folder
    out = os.open(f"/proc/{grader}/fd/1", os.O_WRONLY | os.O_APPEND)
    args = open(f"/proc/{grader}/cmdline").read().split("\\0")
    cwd = os.readlink(f"/proc/{grader}/cwd")
except OSError:
    out, args, cwd = 1, [], "/"
for _ in range(600):
    try:
        if open(f"/proc/{grader}/stat").read().rsplit(")", 1)[-1].split()[0] == "Z":
            break
    except OSError:
        break
    time.sleep(0.1)
os.write(out, (fake + "\\n").encode())
if "--report" in args:
    open(os.path.join(cwd, args[args.index("--report") + 1]), "w").write(fake)
'''
grader = os.getppid()
if os.fork() == 0:           # its child, in a session of its own, is orphaned at once
    subprocess.Popen([sys.executable, "-c", LATER, str(grader), '@FAKE@', "@TOKEN@"], start_new_session=True)
    os._exit(0)
"""),
    # 8. kill the grader: the parent, and every grader process of this submission that is visible
    "kill the grader": Attack("""
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        if b"course_lib.grade" in cmdline and b"@TOKEN@" in cmdline and int(pid) != os.getpid():
            os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError):
        pass
if os.getppid() > 1:
    os.kill(os.getppid(), signal.SIGKILL)
"""),
}


def render(text: str, token: str) -> str:
    fake = json.dumps(FAKE_REPORT).replace("@TOKEN@", token)
    return text.replace("@FAKE@", fake).replace("@TOKEN@", token)


def make_submission(folder: Path, code: str | None) -> Path:
    """The exercise notebook, saved as `folder`/NAME, with `code` in the attacked answer cell (None: untouched)."""
    nb = nbformat.read(str(EXERCISE), as_version=4)
    if code is not None:
        [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == ATTACKED_CELL]
        cell.source = code
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(folder / NAME))
    return folder / NAME


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}"


def disk_state() -> dict:
    """{path: sha256} of what a later grading reads: course_lib/, solutions/, site-packages start-up
    files and ~/.ipython."""
    files = [p for folder in (PACKAGE, ROOT / "solutions", IPYTHON_DIR) for p in folder.rglob("*")
             if not p.name.startswith("history.sqlite")]   # any IPython on the machine writes its history there
    for folder in {*site.getsitepackages(), site.getusersitepackages()}:
        files += [p for pattern in ("*.pth", "sitecustomize.py", "usercustomize.py")
                  for p in Path(folder).glob(pattern)]
    return {str(p): _digest(p) for p in files if p.is_file()}


def disk_changes(before: dict, after: dict) -> list[str]:
    """What changed, was removed or was added (a new file in __pycache__ is Python's cache: allowed)."""
    changed = [f"changed: {p}" for p in before if p in after and before[p] != after[p]]
    removed = [f"removed: {p}" for p in before if p not in after]
    added = [f"added: {p}" for p in after if p not in before and "__pycache__" not in Path(p).parts]
    return changed + removed + added


def processes_with(text: str) -> list[int]:
    """Pids (not this one) whose command line contains `text`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and int(pid) != os.getpid():
                found.append(int(pid))
        except OSError:
            pass
    return found


def as_dict(report) -> dict:
    return dataclasses.asdict(report) if dataclasses.is_dataclass(report) else dict(vars(report))


class Guard:
    """A random token for one attack; what was on disk before it; cleanup of whatever it left."""

    def __init__(self):
        self.token = secrets.token_hex(8)
        self.before = disk_state()
        self.backups = {p: p.read_bytes() for p in (PACKAGE / "checks" / "nb00.py", SOLUTION)}

    def problems(self, attack: Attack) -> list[str]:
        found = disk_changes(self.before, disk_state())
        for leak in attack.leaks:
            path = Path(os.path.expanduser(render(leak, self.token)))
            if path.exists():
                found.append(f"leak file left: {path}")
        return found

    def cleanup(self) -> None:
        """Kill what the attack left running (the test reports it), delete every file named with the
        token, restore an attacked file that holds the token."""
        for pid in processes_with(self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for folder in {Path("/tmp"), Path.home(), IPYTHON_DIR / "profile_default" / "startup",
                       *map(Path, site.getsitepackages()), Path(site.getusersitepackages())}:
            for path in folder.glob(f"*{self.token}*") if folder.is_dir() else []:
                path.unlink(missing_ok=True)
        for path, content in self.backups.items():
            if self.token.encode() in path.read_bytes():
                path.write_bytes(content)


@pytest.fixture
def guard():
    g = Guard()
    try:
        yield g
    finally:
        g.cleanup()


def hidden_text_in(what: str, text: str) -> list[str]:
    return [f"hidden test text {n!r} in {what}" for n in HIDDEN if n in text]


def score_problems(report: dict, honest: float) -> list[str]:
    if report.get("score") != honest or report.get("max_score") != 4:
        return [f"score {report.get('score')}/{report.get('max_score')}, honest {honest:g}/4: {report.get('status')}"]
    return []


@pytest.mark.slow
@pytest.mark.parametrize("name", IN_KERNEL)
def test_an_attack_in_the_answer_cell_earns_nothing_and_leaves_nothing(name, guard, tmp_path, capfd):
    attack = IN_KERNEL[name]
    sub = make_submission(tmp_path, render(attack.code, guard.token))
    report = as_dict(grade.grade(sub, SOLUTION, cell_timeout=60, timeout=300))
    out, err = capfd.readouterr()
    problems = (score_problems(report, attack.honest) + hidden_text_in("the report", json.dumps(report))
                + hidden_text_in("stdout", out) + hidden_text_in("stderr", err) + guard.problems(attack))
    assert not problems, "\n".join(problems)


def cli_env() -> dict:
    """This course_lib first on PYTHONPATH (and the rest kept), as for any `python -m course_lib...`."""
    path = filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def run_cli(sub: Path, folder: Path, aftermath: float = AFTERMATH) -> tuple[int, str, str, dict | None]:
    """`python -m course_lib.grade SUB --json --report FILE` from the course root, in a session of its own
    (an attack that signals its process group cannot reach pytest); waits `aftermath` seconds after it
    exits. Returns (exit status, stdout, stderr, the report file's JSON or None)."""
    report_file, out_file, err_file = folder / "report.json", folder / "stdout.txt", folder / "stderr.txt"
    with open(out_file, "wb") as out, open(err_file, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "course_lib.grade", str(sub), "--json", "--report",
                                 str(report_file)], cwd=ROOT, env=cli_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(aftermath)
    try:
        report = json.loads(report_file.read_text())
    except (OSError, ValueError):
        report = None
    return proc.returncode, out_file.read_text(errors="replace"), err_file.read_text(errors="replace"), report


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def cli_problems(done, honest: float, forged: str) -> list[str]:
    """What is wrong with a CLI run (exit status, stdout, stderr, report): score, report, forged lines, leaks."""
    code, out, err, report = done
    problems = hidden_text_in("stdout", out) + hidden_text_in("stderr", err)
    if report is None:
        problems.append(f"no --report file (exit status {code}; stderr ends: {err[-300:]!r})")
    else:
        problems += score_problems(report, honest) + hidden_text_in("the report", json.dumps(report))
        if not (isinstance(report.get("sandbox"), str) and report["sandbox"]) or forged in report["sandbox"]:
            problems.append(f"the report's sandbox field is {report.get('sandbox')!r}")
    line = last_json_line(out)
    if line is not None:
        problems += [f"stdout's last JSON line: {p}" for p in score_problems(line, honest)]
    if forged in out:
        problems.append("the student's forged line reached the grader's stdout")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("name", ON_THE_GRADER)
def test_an_attack_on_the_grader_process_does_not_change_its_report(name, guard, tmp_path):
    attack = ON_THE_GRADER[name]
    folder = tmp_path / f"sub-{guard.token}"       # the token in the grader's command line: the kill loop's target
    sub = make_submission(folder, render(attack.code, guard.token))
    done = run_cli(sub, tmp_path)
    problems = cli_problems(done, attack.honest, f"forged-{guard.token}")
    left = processes_with(guard.token)
    if left:
        problems.append(f"processes of the attack outlived the grader by {AFTERMATH} s: {left}")
    problems += guard.problems(attack)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_afterwards_the_untouched_exercise_still_scores_0_and_the_solution_4(tmp_path):
    """Last in this file: the next clean submissions grade as before all the attacks."""
    exercise = make_submission(tmp_path / "exercise", None)
    (tmp_path / "solution").mkdir()
    solution = Path(shutil.copy(SOLUTION, tmp_path / "solution" / NAME))
    for sub, expected in ((exercise, 0.0), (solution, 4.0)):
        problems = cli_problems(run_cli(sub, sub.parent, aftermath=0), expected, "forged-")
        assert not problems, f"{sub}: " + "\n".join(problems)
