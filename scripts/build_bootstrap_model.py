"""Build ContextServe's bootstrap classifier from really timed agent commands.

What it does (default):

1. Generates a small Python project in a temporary directory: a package
   ``demo_pkg`` with a few modules, tests that pass, one that fails and an
   "integration" file whose tests wait on I/O (``time.sleep``) so the whole
   suite takes ~12 s like a real one, helper scripts that compute or wait for
   a given number of seconds, data files, a ``Makefile``, and a git
   repository with two commits (when ``git`` is installed).
2. Runs a corpus of ~230 typical agent commands there with ``bash -c`` and
   measures each one's wall time: ls/cat/head/grep/find/sed -n/wc/git
   variants, ``python -c``, scripts of various durations, ``python -m
   pytest`` on single test ids and on the whole suite, ``pip --version`` /
   ``pip list``, ``python -m compileall``, ``make``, ``sleep 0.1`` ...
   ``sleep 15``, ``timeout 5 ...``. Three phases keep the timings honest and
   the total under ~2 minutes: short commands one at a time with nothing
   else running; commands that mostly wait (sleep, the sleeping test suite)
   8 at a time; long CPU-bound commands 2 at a time (they loop until a wall
   deadline, so their duration does not depend on sharing a core). The
   waiting phase also holds a few read-only, machine-scale file-system
   commands (``find /usr``, ``grep -r`` over the standard library).
3. Appends a few *prior* records (``"source": "prior"``): commands whose cost
   is network downloads or large builds that cannot be reproduced offline in
   a temp dir (``pip install -r requirements.txt``, ``npm install``,
   ``apt-get install``, ``cargo build``, ``docker build``, downloads with
   ``curl``/``wget``/``git clone``, ...), with conservative typical
   durations (mostly >= 20 s; a shallow clone 4 s, an API call 0.6 s). They
   are not measurements; ``--no-priors`` leaves them out.
4. Writes the dataset to ``estimators/data/bootstrap_commands.jsonl`` (one
   ``{"command", "seconds", "source"}`` object per line), fits
   ``DurationClassifier`` (FAST <= 2 s, SLOW >= 10 s; see
   ``estimators/xgb_classifier.py``), prints class balance and 5-fold
   cross-validated accuracy, and saves the model to
   ``estimators/data/bootstrap_xgb.json`` (xgboost JSON format).

Retraining from a server's own history. Export the (command, measured tool
seconds) pairs your agents produced as JSONL, one
``{"command": "...", "seconds": 1.23}`` per line (e.g. from the agent
framework's logs, or by recording ``ToolCall.command`` next to each duration
the scheduler measures), then::

    python scripts/build_bootstrap_model.py --from-jsonl history.jsonl \\
        [--merge-bootstrap] --model-out my_model.json

and start the server with ``xgb_model_path`` pointing at ``my_model.json``.
In Python, ``dataset_from_history(pairs)`` (re-exported here from
``vllm_continuum_plugin.estimators.xgb_classifier``) turns any iterable of
``(command, seconds)`` into the feature matrix and durations that
``DurationClassifier.fit`` takes. ``--train-only`` refits from the shipped
dataset without re-measuring (after a feature change).

Usage: python scripts/build_bootstrap_model.py [--from-jsonl PATH]
       [--merge-bootstrap] [--train-only] [--no-priors] [--list]
       [--dataset-out PATH] [--model-out PATH] [--fast-threshold S]
       [--slow-threshold S]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bootstrap_project import build_project, project_env  # scripts/ is on the path when run as a script
from vllm_continuum_plugin.estimators.context_config import data_path
from vllm_continuum_plugin.estimators.xgb_classifier import (
    BOOTSTRAP_DATASET_FILE,
    BOOTSTRAP_MODEL_FILE,
    DurationClassifier,
    dataset_from_history,
    label_for,
    load_dataset_jsonl,
)

__all__ = ["CORPUS", "PRIORS", "build_project", "dataset_from_history", "main", "measure_corpus", "train"]

COMMAND_TIMEOUT_S = 90.0

# --------------------------------------------------------------------------
# Corpus: (command, mode). mode: "seq" short, run alone; "io" mostly waits
# (8 in parallel); "cpu" long CPU-bound with a wall deadline (2 in parallel).
# --------------------------------------------------------------------------
_SEQ = [
    # listing
    "ls", "ls -la", "ls -l demo_pkg", "ls tests/", "ls -1 data | head -5", "ls -lh data/", "ls -a",
    "ls demo_pkg/*.py", "ls -lt | head", "ls -R demo_pkg", "tree -L 2 || ls -R", "pwd", "pwd && ls",
    # reading files
    "cat README.md", "cat demo_pkg/mathutils.py", "cat requirements.txt", "cat setup.cfg",
    "cat demo_pkg/textutils.py | head -n 20", "cat -n demo_pkg/__init__.py", "head -n 30 demo_pkg/mathutils.py",
    "head -5 data/measurements.csv", "tail -n 20 data/app.log", "tail -5 data/measurements.csv",
    "head -c 200 data/app.log", "nl demo_pkg/slowcalc.py | head -20", "wc -l demo_pkg/*.py",
    "wc -l data/measurements.csv", "wc -c data/app.log",
    "sed -n '1,40p' demo_pkg/mathutils.py", "sed -n '10,20p' demo_pkg/textutils.py", "sed -n '5p' README.md",
    "sed -n '/def /p' demo_pkg/mathutils.py", "awk -F, '{print $2}' data/measurements.csv | head",
    "sort data/words.txt | uniq -c | sort -rn | head", "cut -d, -f1 data/measurements.csv | sort | uniq | wc -l",
    "cat data/config.json", "python -m json.tool data/config.json",
    # searching
    "grep -n def demo_pkg/mathutils.py", "grep -rn TODO .", "grep -rn 'import' demo_pkg", "grep -c ERROR data/app.log",
    "grep -n 'assert' tests/test_mathutils.py", "grep -ri warning data/app.log | head", "grep -l fibonacci -r demo_pkg tests",
    "grep -rn --include='*.py' 'def test_' tests", "grep -E 'ERROR|WARN' data/app.log | wc -l",
    "find . -name '*.py'", "find . -maxdepth 1 -type f", "find . -maxdepth 2 -name '*.py' | head",
    "find demo_pkg -name '*.py' -newer README.md", "find . -type d -name __pycache__", "find . -name '*.csv' | xargs wc -l",
    "find tests -maxdepth 1 -name 'test_*.py'",
    # git
    "git status", "git status --short", "git log --oneline -5", "git log -3 --stat", "git diff", "git diff --stat",
    "git diff HEAD~1 --stat", "git show --stat HEAD", "git show HEAD:README.md | head -5", "git branch", "git branch -a",
    "git rev-parse HEAD", "git ls-files | head -20", "git blame demo_pkg/mathutils.py | head -5", "git log --oneline | wc -l",
    "git remote -v", "git stash list", "git config user.name",
    # shell odds and ends
    "echo hello", "echo $PATH | tr ':' '\\n' | head -3", "which python", "which git pip", "env | sort | head -5",
    "printenv HOME", "whoami", "date", "uname -a", "hostname", "id -u", "true", "basename $(pwd)",
    "realpath demo_pkg", "stat README.md", "file README.md", "du -sh .", "df -h . | tail -1", "cd demo_pkg && ls",
    "cd tests && ls -la && cd ..", "mkdir -p build/tmp && ls build", "touch build/marker && ls build",
    "cp README.md build/README.copy && ls build", "mv build/README.copy build/README.bak", "rm -f build/README.bak",
    "diff demo_pkg/mathutils.py demo_pkg/textutils.py | head", "cmp data/words.txt data/words.txt && echo same",
    "test -f setup.cfg && echo yes", "for f in demo_pkg/*.py; do wc -l $f; done", "for i in 1 2 3; do echo $i; done",
    "ls | while read f; do echo $f; done", "echo 'x = 1' > build/gen.py && cat build/gen.py",
    "sed -i 's/VERSION = .*/VERSION = \"0.1.1\"/' demo_pkg/__init__.py", "sed -i.bak 's/foo/bar/g' data/words.txt",
    "git add -A && git status --short", "git commit -qm 'bump version' && git log --oneline -1",
    "git checkout -q -b feature && git checkout -q -", "git stash && git stash pop",
    "chmod +x scripts/analyze.py && ls -l scripts", "ln -sf README.md build/link && readlink build/link",
    "timeout 1 sleep 5", "timeout 0.5 python scripts/fetch_data.py --seconds 10", "timeout 2 python scripts/train.py --seconds 1",
    "timeout 5 ls -la",
    # python
    "python --version", "python -V", "python -c 'print(1 + 1)'", "python -c 'import sys; print(sys.version)'",
    "python -c 'import json, os; print(os.getcwd())'", "python -c 'import demo_pkg; print(demo_pkg.VERSION)'",
    "python -c 'from demo_pkg.mathutils import fibonacci; print(fibonacci(20))'", "python -c 'import numpy; print(numpy.__version__)'",
    "python -c 'import this' | head -3", "python scripts/analyze.py data/measurements.csv", "python scripts/analyze.py --summary data/measurements.csv",
    "python3 scripts/analyze.py data/measurements.csv | tail -3", "python scripts/train.py --seconds 0.3",
    "python scripts/train.py --seconds 1.2", "python scripts/fetch_data.py --seconds 0.5", "python scripts/fetch_data.py --seconds 1.5",
    "python -m demo_pkg.cli --help", "python -m demo_pkg.cli stats data/measurements.csv", "./scripts/analyze.py data/measurements.csv",
    "python -m compileall -q demo_pkg", "python -m py_compile demo_pkg/mathutils.py", "python -m pydoc demo_pkg.mathutils | head -20",
    "python -m pytest tests/test_mathutils.py::test_add -q", "python -m pytest tests/test_mathutils.py::test_fibonacci -q",
    "python -m pytest tests/test_textutils.py::test_slugify -q", "python -m pytest -q tests/test_textutils.py::test_wrap_fails",
    "python -m pytest -k fibonacci -q", "pytest tests/test_mathutils.py::test_mean -q", "python -m pytest tests/test_mathutils.py -q",
    "python -m pytest --collect-only -q", "pytest --version", "python -m unittest tests.test_mathutils",
    "pip --version", "pip list", "pip list | grep -i numpy", "pip show numpy", "pip freeze | head -5", "pip show pytest | head -3",
    "python -m pip --version", "python -m pip show xgboost", "pip check | tail -1",
    # short waits
    "sleep 0.1", "sleep 0.2", "sleep 0.3", "sleep 0.5", "sleep 0.8", "sleep 1", "sleep 1.5", "sleep 1.8",
    "sleep 0.2 && ls", "ls && sleep 0.5 && cat README.md",
    "make -n test", "make help", "make lint",
]
_IO = [
    # waits between the thresholds
    "sleep 2.5", "sleep 3", "sleep 4", "sleep 5", "sleep 6", "sleep 7.5", "sleep 9",
    "python scripts/fetch_data.py --seconds 3", "python scripts/fetch_data.py --seconds 5",
    "python scripts/fetch_data.py --seconds 8", "python scripts/fetch_data.py --url http://localhost/data --seconds 4",
    "timeout 5 python scripts/fetch_data.py --seconds 30", "timeout 3 sleep 10", "timeout 8 sleep 60",
    "for i in 1 2 3; do sleep 1; done", "for i in $(seq 5); do sleep 1; echo $i; done", "sleep 2 && echo done",
    "python -m pytest tests/test_integration.py::test_sync_small -q", "python -m pytest tests/test_integration.py::test_sync_medium -q",
    "python -m pytest -q -k 'integration and small'", "pytest tests/test_integration.py::test_sync_large -q",
    "python -c 'import time; time.sleep(3)'", "python -c 'import time; time.sleep(6); print(\"ok\")'",
    "cd tests && python -m pytest test_integration.py::test_sync_medium -q",
    # waits past the slow threshold
    "sleep 10", "sleep 11", "sleep 12", "sleep 14", "sleep 15", "sleep 20",
    "python scripts/fetch_data.py --seconds 11", "python scripts/fetch_data.py --seconds 14",
    "python scripts/fetch_data.py --url http://localhost/big --seconds 18", "timeout 12 sleep 30",
    "timeout 15 python scripts/fetch_data.py --seconds 60", "for i in 1 2 3 4 5 6; do sleep 2; done",
    "python -c 'import time; time.sleep(12)'", "sleep 5 && sleep 6",
    "python -m pytest", "python -m pytest -q", "python -m pytest -x -q", "python -m pytest tests/ -q",
    "python -m pytest -v", "pytest", "pytest -q tests", "python -m pytest --tb=short -q",
    "python -m pytest tests/test_integration.py -q", "make test", "make all", "make check",
    "cd demo_pkg && cd .. && python -m pytest -q", "python -m pytest -q 2>&1 | tail -5",
    # machine-scale, read-only file-system work (mostly waits on the disk;
    # really run, so durations depend on the host and its page cache)
    "find /usr -name '*.py' 2>/dev/null | wc -l", "grep -rn 'def main' $STDLIB/email | wc -l",
    "grep -rl TODO $STDLIB | head", "du -sh $STDLIB/email", "ls -R /usr/lib | wc -l",
    "grep -rn 'import os' $STDLIB/json $STDLIB/email $STDLIB/http | wc -l",
]
_CPU = [
    "python scripts/train.py --seconds 2.5", "python scripts/train.py --seconds 4", "python scripts/train.py --seconds 6",
    "python scripts/train.py --seconds 8 --epochs 3", "python scripts/train.py --seconds 11", "python scripts/train.py --seconds 13 --epochs 10",
    "python scripts/train.py --seconds 16", "python scripts/build_index.py --seconds 3", "python scripts/build_index.py --seconds 12",
    "python -m compileall -f -q demo_pkg tests scripts",
]
CORPUS: list[tuple[str, str]] = (
    [(c, "seq") for c in _SEQ] + [(c, "io") for c in _IO] + [(c, "cpu") for c in _CPU]
)

# Not measurable offline (network downloads, large builds): conservative
# typical durations, recorded with source "prior" (see module docstring).
PRIORS: list[tuple[str, float]] = [
    ("pip install -r requirements.txt", 35.0),
    ("pip install numpy pandas", 25.0),
    ("pip install -e .", 20.0),
    ("python -m pip install --upgrade torch", 90.0),
    ("pip install -q transformers", 40.0),
    ("npm install", 45.0),
    ("npm ci", 40.0),
    ("yarn install", 40.0),
    ("sudo apt-get update && sudo apt-get install -y build-essential", 60.0),
    ("apt-get install -y curl", 20.0),
    ("conda install -y scipy", 90.0),
    ("cargo build --release", 120.0),
    ("cargo test", 60.0),
    ("docker build -t app .", 150.0),
    ("mvn -q package", 90.0),
    ("./gradlew build", 120.0),
    ("go test ./...", 30.0),
    ("cmake --build build -j8", 60.0),
    ("git clone https://github.com/pytorch/pytorch.git", 120.0),
    ("npm run build", 40.0),
    ("docker pull python:3.11", 30.0),
    ("docker run --rm app pytest", 45.0),
    ("wget https://example.com/dataset.tar.gz", 25.0),
    ("curl -L -o model.safetensors https://huggingface.co/org/model/resolve/main/model.safetensors", 40.0),
    ("huggingface-cli download org/model", 60.0),
    ("git clone --depth 1 https://github.com/psf/requests.git", 4.0),
    ("curl -s https://api.github.com/repos/psf/requests", 0.6),
    ("ssh build-host 'make -C /srv/app'", 60.0),
]


# --------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    command: str
    seconds: float
    returncode: int
    mode: str


def _run_one(command: str, mode: str, root: Path, env: dict[str, str]) -> Measurement:
    start = time.perf_counter()
    try:
        proc = subprocess.run(["bash", "-c", command], cwd=root, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=COMMAND_TIMEOUT_S)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = -9
    return Measurement(command, time.perf_counter() - start, code, mode)


def measure_corpus(root: Path, corpus: Sequence[tuple[str, str]], verbose: bool = True) -> list[Measurement]:
    """Time every corpus command in ``root`` (phases: see module docstring)."""
    env = project_env(root)
    results: list[Measurement] = []
    seq = [c for c, m in corpus if m == "seq"]
    io = [c for c, m in corpus if m == "io"]
    cpu = [c for c, m in corpus if m == "cpu"]
    start = time.perf_counter()
    for command in seq:
        results.append(_run_one(command, "seq", root, env))
    if verbose:
        print(f"  {len(seq)} short commands in {time.perf_counter() - start:.1f}s", flush=True)
    for commands, mode, width in ((io, "io", 8), (cpu, "cpu", 2)):
        phase = time.perf_counter()
        with ThreadPoolExecutor(max_workers=width) as pool:
            results.extend(pool.map(lambda c, m=mode: _run_one(c, m, root, env), commands))
        if verbose:
            print(f"  {len(commands)} {mode} commands ({width} at a time) in {time.perf_counter() - phase:.1f}s", flush=True)
    return results


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------
def _class_balance(seconds: np.ndarray, fast: float, slow: float) -> dict[str, int]:
    labels = [label_for(s, fast, slow) for s in seconds]
    return {name: labels.count(i) for i, name in enumerate(("fast", "uncertain", "slow"))}


def _cross_validate(x: np.ndarray, y: np.ndarray, fast: float, slow: float, confidence: float,
                    folds: int = 5) -> dict[str, float]:
    """5-fold CV: argmax accuracy, and the layer's view -- the share of
    records it decides on (top probability >= confidence) and its accuracy
    there, plus how often it calls a truly SLOW/UNCERTAIN command FAST."""
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    truth = np.asarray([label_for(s, fast, slow) for s in y])
    proba = np.zeros((len(y), 3))
    for k in range(folds):
        test = order[k::folds]
        train_idx = np.setdiff1d(order, test)
        model = DurationClassifier.fit(x[train_idx], y[train_idx], fast, slow)
        proba[test] = np.vstack([model.predict_proba_features(row) for row in x[test]])
    pred = proba.argmax(axis=1)
    decided = proba.max(axis=1) >= confidence
    wrong_fast = decided & (pred == 0) & (truth != 0)
    return {
        "accuracy": float(np.mean(pred == truth)),
        "coverage": float(np.mean(decided)),
        "accuracy_when_decided": float(np.mean(pred[decided] == truth[decided])) if decided.any() else 0.0,
        "false_fast_rate": float(np.sum(wrong_fast) / max(1, np.sum(truth != 0))),
    }


def train(pairs: Iterable[tuple[str, float]], model_out: Path, fast: float, slow: float,
          cross_validate: bool = True, confidence: float = 0.8) -> DurationClassifier:
    """Fit on (command, seconds) pairs, print diagnostics, save the model."""
    x, y = dataset_from_history(pairs)
    if len(y) == 0:
        raise SystemExit("no valid (command, seconds) records to train on")
    balance = _class_balance(y, fast, slow)
    print(f"training on {len(y)} records; classes (FAST <= {fast}s, SLOW >= {slow}s): {balance}")
    if cross_validate and len(y) >= 25:
        cv = _cross_validate(x, y, fast, slow, confidence)
        print(
            f"5-fold CV: accuracy {cv['accuracy']:.3f} (argmax); at confidence {confidence}: decides "
            f"{cv['coverage']:.0%} of records with accuracy {cv['accuracy_when_decided']:.3f}; "
            f"non-FAST records called FAST: {cv['false_fast_rate']:.1%}"
        )
    model = DurationClassifier.fit(x, y, fast, slow)
    model_out.parent.mkdir(parents=True, exist_ok=True)
    model.save(model_out)
    print(f"wrote {model_out} ({model_out.stat().st_size / 1024:.0f} KiB)")
    return model


def _write_dataset(path: Path, records: Sequence[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    print(f"wrote {path} ({len(records)} records)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-jsonl", type=Path, help="train from a JSONL of {command, seconds} instead of measuring")
    parser.add_argument("--merge-bootstrap", action="store_true", help="with --from-jsonl: add the shipped dataset")
    parser.add_argument("--train-only", action="store_true", help="refit from the shipped dataset without measuring")
    parser.add_argument("--no-priors", action="store_true", help="leave the prior records out")
    parser.add_argument("--list", action="store_true", help="print the corpus and exit")
    parser.add_argument("--dataset-out", type=Path, default=data_path(BOOTSTRAP_DATASET_FILE))
    parser.add_argument("--model-out", type=Path, default=data_path(BOOTSTRAP_MODEL_FILE))
    parser.add_argument("--fast-threshold", type=float, default=2.0)
    parser.add_argument("--slow-threshold", type=float, default=10.0)
    args = parser.parse_args(argv)
    if not 0 < args.fast_threshold <= args.slow_threshold:
        parser.error(f"need 0 < --fast-threshold <= --slow-threshold, got {args.fast_threshold}, {args.slow_threshold}")

    if args.list:
        for command, mode in CORPUS:
            print(f"{mode:4s} {command}")
        for command, seconds in PRIORS:
            print(f"prior {command}  ({seconds:g}s)")
        return 0
    if args.from_jsonl is not None:
        pairs = load_dataset_jsonl(args.from_jsonl)
        if args.merge_bootstrap:
            pairs += load_dataset_jsonl(data_path(BOOTSTRAP_DATASET_FILE))
        train(pairs, args.model_out, args.fast_threshold, args.slow_threshold)
        return 0
    if args.train_only:
        train(load_dataset_jsonl(args.dataset_out), args.model_out, args.fast_threshold, args.slow_threshold)
        return 0

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="contextserve-bootstrap-") as tmp:
        root = Path(tmp)
        build_project(root)
        print(f"measuring {len(CORPUS)} commands in {root}", flush=True)
        measurements = measure_corpus(root, CORPUS)
    records: list[dict[str, object]] = [
        {"command": m.command, "seconds": round(m.seconds, 4), "source": "measured", "returncode": m.returncode}
        for m in measurements
    ]
    if not args.no_priors:
        records += [{"command": c, "seconds": s, "source": "prior"} for c, s in PRIORS]
    print(f"measured in {time.perf_counter() - started:.1f}s")
    _write_dataset(args.dataset_out, records)
    train([(str(r["command"]), float(r["seconds"])) for r in records],  # type: ignore[arg-type]
          args.model_out, args.fast_threshold, args.slow_threshold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
