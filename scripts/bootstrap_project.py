"""The demo project the bootstrap corpus runs agent commands against.

``scripts/build_bootstrap_model.py`` measures real command durations in it:
a small Python package with tests, data files and a git history, written
fresh into a temporary directory (``build_project``), and the environment
the commands run in (``project_env``: no pager, no prompts, a fixed git
identity).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np

__all__ = ["build_project", "project_env"]

_FILES: dict[str, str] = {
    "README.md": """\
        # demo_pkg

        A small package the bootstrap corpus runs agent commands against.
        TODO: document the CLI.
        foo bar baz
        """,
    "requirements.txt": "numpy>=1.24\npytest>=7\n",
    "setup.cfg": "[metadata]\nname = demo_pkg\nversion = 0.1.0\n\n[tool:pytest]\ntestpaths = tests\n",
    "Makefile": """\
        .PHONY: test all check lint help
        help:
        \t@echo "targets: test all check lint"
        lint:
        \tpython -m compileall -q demo_pkg
        test:
        \tpython -m pytest -q
        check: lint test
        all: lint test
        \tpython scripts/analyze.py data/measurements.csv
        """,
    "demo_pkg/__init__.py": 'VERSION = "0.1.0"\n',
    "demo_pkg/mathutils.py": """\
        \"\"\"Math helpers.\"\"\"


        def add(a, b):
            return a + b


        def mean(values):
            values = list(values)
            return sum(values) / len(values)


        def fibonacci(n):
            a, b = 0, 1
            for _ in range(n):
                a, b = b, a + b
            return a


        def primes(limit):
            # TODO: use a sieve
            return [n for n in range(2, limit) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
        """,
    "demo_pkg/textutils.py": """\
        \"\"\"Text helpers.\"\"\"
        import re
        import textwrap


        def slugify(text):
            return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


        def wrap(text, width=20):
            return textwrap.wrap(text, width)


        def count_words(text):
            counts = {}
            for word in text.split():
                counts[word] = counts.get(word, 0) + 1
            return counts
        """,
    "demo_pkg/slowcalc.py": """\
        \"\"\"CPU-bound work that runs until a wall-clock deadline.\"\"\"
        import time


        def burn(seconds):
            deadline = time.monotonic() + seconds
            total = 0
            while time.monotonic() < deadline:
                total += sum(i * i for i in range(2000))
            return total
        """,
    "demo_pkg/cli.py": """\
        import argparse
        import csv
        import statistics

        parser = argparse.ArgumentParser(prog="demo_pkg.cli")
        parser.add_argument("command", choices=["stats"])
        parser.add_argument("path")
        args = parser.parse_args()
        with open(args.path) as f:
            rows = list(csv.DictReader(f))
        values = [float(r["value"]) for r in rows]
        print(len(values), statistics.mean(values), statistics.pstdev(values))
        """,
    "tests/test_mathutils.py": """\
        from demo_pkg.mathutils import add, fibonacci, mean, primes


        def test_add():
            assert add(2, 3) == 5


        def test_mean():
            assert mean([1, 2, 3]) == 2


        def test_fibonacci():
            assert fibonacci(10) == 55


        def test_primes():
            assert primes(20) == [2, 3, 5, 7, 11, 13, 17, 19]
        """,
    "tests/test_textutils.py": """\
        from demo_pkg.textutils import count_words, slugify, wrap


        def test_slugify():
            assert slugify("Hello, World!") == "hello-world"


        def test_count_words():
            assert count_words("a b a") == {"a": 2, "b": 1}


        def test_wrap_fails():
            assert wrap("a " * 30, 10) == []  # a failing test, as agents meet them
        """,
    "tests/test_integration.py": """\
        \"\"\"Tests that wait on a (simulated) service, like real integration tests.\"\"\"
        import time


        def test_sync_small():
            time.sleep(2.5)


        def test_sync_medium():
            time.sleep(3.5)


        def test_sync_large():
            time.sleep(5)


        def test_roundtrip():
            time.sleep(1)
        """,
    "scripts/analyze.py": """\
        #!/usr/bin/env python3
        import csv
        import sys

        args = [a for a in sys.argv[1:] if not a.startswith("--")]
        with open(args[0]) as f:
            rows = list(csv.DictReader(f))
        by_name = {}
        for row in rows:
            by_name.setdefault(row["name"], []).append(float(row["value"]))
        for name, values in sorted(by_name.items()):
            print(name, len(values), sum(values) / len(values))
        """,
    "scripts/train.py": """\
        import argparse
        import sys

        sys.path.insert(0, ".")
        from demo_pkg.slowcalc import burn

        parser = argparse.ArgumentParser()
        parser.add_argument("--seconds", type=float, default=1.0)
        parser.add_argument("--epochs", type=int, default=1)
        args = parser.parse_args()
        for epoch in range(args.epochs):
            burn(args.seconds / args.epochs)
            print(f"epoch {epoch} done")
        """,
    "scripts/build_index.py": """\
        import argparse
        import sys

        sys.path.insert(0, ".")
        from demo_pkg.slowcalc import burn

        parser = argparse.ArgumentParser()
        parser.add_argument("--seconds", type=float, default=1.0)
        burn(parser.parse_args().seconds)
        print("index built")
        """,
    "scripts/fetch_data.py": """\
        \"\"\"Waits like a download of the given duration.\"\"\"
        import argparse
        import time

        parser = argparse.ArgumentParser()
        parser.add_argument("--seconds", type=float, default=1.0)
        parser.add_argument("--url", default="http://localhost/data")
        args = parser.parse_args()
        time.sleep(args.seconds)
        print("fetched", args.url)
        """,
}


def build_project(root: Path) -> None:
    """Write the demo project under ``root`` and make it a git repository."""
    for rel, text in _FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (root / "tests" / "__init__.py").write_text("")
    rng = np.random.default_rng(0)
    names = ["alpha", "beta", "gamma", "delta"]
    lines = ["name,value"] + [f"{names[i % 4]},{v:.3f}" for i, v in enumerate(rng.normal(10, 2, 2000))]
    (root / "data").mkdir(exist_ok=True)
    (root / "data" / "measurements.csv").write_text("\n".join(lines) + "\n")
    levels = ["INFO", "INFO", "INFO", "WARNING", "ERROR"]
    log = [f"2024-01-01 00:{i // 60:02d}:{i % 60:02d} {levels[i % 5]} event {i}" for i in range(3000)]
    (root / "data" / "app.log").write_text("\n".join(log) + "\n")
    words = rng.choice(["foo", "bar", "baz", "qux", "quux"], size=500)
    (root / "data" / "words.txt").write_text("\n".join(words) + "\n")
    (root / "data" / "config.json").write_text(json.dumps({"name": "demo", "threads": 4, "paths": ["a", "b"]}))
    (root / "build").mkdir(exist_ok=True)
    if shutil.which("git"):
        env = project_env(root)
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "initial"]):
            subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)
        with open(root / "demo_pkg" / "mathutils.py", "a") as f:
            f.write("\n\ndef square(x):\n    return x * x\n")
        subprocess.run(["git", "commit", "-qam", "add square"], cwd=root, env=env, check=True, capture_output=True)
        with open(root / "demo_pkg" / "textutils.py", "a") as f:
            f.write("\n# TODO: unicode slugs\n")  # an uncommitted change for git diff


def project_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update({
        "GIT_PAGER": "cat", "PAGER": "cat", "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.com",
        "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.com", "PYTHONPATH": str(root),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PYTEST_ADDOPTS": "-p no:cacheprovider",
        "STDLIB": sysconfig.get_paths()["stdlib"],
    })
    env.pop("VIRTUAL_ENV_PROMPT", None)
    return env
