"""The task an agent of ``agent_loop`` is given: the prompts, and the
throw-away workspace (a small generated Python project whose test fails:
``calc.add`` subtracts), committed to a git repository when ``git`` is
available.

``SUBMIT_TOKEN`` is how an agent says it is done (``echo SUBMIT`` or the
``submit`` shell function that ``agent_commands.CommandRunner`` defines).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

__all__ = [
    "FORMAT_ERROR",
    "SUBMIT_TOKEN",
    "SYSTEM_PROMPT",
    "TASK_TEMPLATE",
    "WORKSPACE_FILES",
    "WRAP_UP",
    "Workspace",
    "login_shell_test_command",
]

SUBMIT_TOKEN = "SUBMIT"

SYSTEM_PROMPT = """\
You are a software engineering agent working in a small Python repository.
You interact with a Linux shell, one command per turn.

Every reply MUST have this format:

THOUGHT: one or two sentences on what you will do next and why.

```bash
<exactly one shell command>
```

Rules:
- Exactly one ```bash block per reply; its command is run in the repository
  root and you receive its output in the next message.
- Allowed commands: ls, cat, head, tail, grep, find, wc, pwd, echo, sed,
  python, python3, pytest, git status/diff/log/show, diff, sort, uniq, cd.
  Edit files with sed -i (for example: sed -i 's/old/new/' file.py).
- Stay inside the repository: no absolute paths, no "..".
- When the task is done, reply with the command: echo SUBMIT
"""

FORMAT_ERROR = """\
Format error: your reply must contain exactly one ```bash block with one \
command, for example:

THOUGHT: I will list the files.

```bash
ls
```

If you are done, reply with the command `echo SUBMIT`."""

WRAP_UP = """\
Your submission was received.
{observation}
Summarize what you changed in one or two sentences. Do not run any more \
commands."""

TASK_TEMPLATE = """\
The tests of this repository fail. Find the bug in the code and fix it.
Run the tests with: {test_command}
When the tests pass, submit with: echo SUBMIT"""


WORKSPACE_FILES: dict[str, str] = {
    "README.md": """\
# calc

A tiny arithmetic library.

* `calc.py` -- `add`, `sub`, `mul`, `mean`
* `utils/text.py` -- `slugify`
* `test_calc.py` -- the tests (`python -m pytest -q` or `python test_calc.py`)
""",
    "calc.py": '''\
"""Small arithmetic helpers."""


def add(a, b):
    """Return a + b."""
    return a - b


def sub(a, b):
    """Return a - b."""
    return add(a, -b)


def mul(a, b):
    """Return a * b."""
    return a * b


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    total = 0
    for v in values:
        total = add(total, v)
    return total / len(values)
''',
    "utils/__init__.py": '"""Helpers shared by the project."""\n',
    "utils/text.py": '''\
"""Text helpers."""


def slugify(text):
    """Lower-case words joined by dashes."""
    return "-".join(text.lower().split())
''',
    "test_calc.py": '''\
"""Tests: run with `python -m pytest -q` or `python test_calc.py`."""

from calc import add, mean, mul, sub
from utils.text import slugify


def test_add():
    assert add(2, 3) == 5, f"add(2, 3) returned {add(2, 3)}"


def test_sub():
    assert sub(5, 3) == 2


def test_mul():
    assert mul(4, 3) == 12


def test_mean():
    assert mean([1, 2, 3]) == 2, f"mean([1, 2, 3]) returned {mean([1, 2, 3])}"


def test_slugify():
    assert slugify("Hello World") == "hello-world"


if __name__ == "__main__":
    import sys
    import traceback

    failed = 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}")
        except AssertionError:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
''',
}


@functools.cache
def login_shell_test_command() -> str:
    """``python -m pytest -q`` when the agent's shell has pytest, else
    ``python test_calc.py``.

    Probed once per process with the same ``bash -lc`` the agent's commands
    use: a login shell may reset PATH and not see the caller's virtualenv.
    """
    probe = subprocess.run(
        ["bash", "-lc", "python -c 'import pytest'"], cwd=tempfile.gettempdir(),
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
    )
    return "python -m pytest -q" if probe.returncode == 0 else "python test_calc.py"


class Workspace:
    """A throw-away directory holding the generated project.

    Invariants: ``path`` is an absolute, symlink-free directory that exists
    from construction until ``remove()``; when ``git`` is available it is a
    git repository whose single commit holds exactly ``WORKSPACE_FILES``
    (so ``git status`` is clean and ``git diff`` shows the agent's edits).
    """

    def __init__(self, prefix: str = "agent-ws-", files: dict[str, str] | None = None) -> None:
        self.path = os.path.realpath(tempfile.mkdtemp(prefix=prefix))
        self.files = dict(WORKSPACE_FILES if files is None else files)
        for relative, content in self.files.items():
            target = os.path.join(self.path, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write(content)
        self.is_git_repo = self._init_git()

    def _init_git(self) -> bool:
        if shutil.which("git") is None:
            return False
        identity = ["-c", "user.name=agent", "-c", "user.email=agent@localhost",
                    "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "Initial commit"]):
            done = subprocess.run(["git", *identity, *args], cwd=self.path,
                                  capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"git {' '.join(args)} failed in {self.path}: {done.stderr.strip()}")
        return True

    @property
    def test_command(self) -> str:
        """How the agent runs the tests (see ``login_shell_test_command``)."""
        return login_shell_test_command()

    def task(self) -> str:
        """The first user message of the job."""
        return TASK_TEMPLATE.format(test_command=self.test_command)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
