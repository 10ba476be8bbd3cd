"""ContextServe's rules layer (pure logic): the shipped rules, an override
file, malformed files, and the seeded priors for agent clients' tool names
(Claude Code's ``Task``/``Read``, code actions by the tools they call).
The other layers and the dispatch: tests/test_context_predictor.py.
"""

from __future__ import annotations

import json
import math

import pytest
from test_context_predictor import FAST, SLOW, UNCERTAIN, call, fallback

from vllm_continuum_plugin.estimators.context_predictor import ContextAwarePredictor, ContextServeConfig, data_path
from vllm_continuum_plugin.estimators.features import parse_duration, parse_simple_command
from vllm_continuum_plugin.estimators.parser import ToolCall, extract_tool_call
from vllm_continuum_plugin.estimators.rules import RulesFileError, RulesLayer, load_rule_set
from vllm_continuum_plugin.estimators.ttl import TTLContext


# ----------------------------------------------------------------------
# Rules
# ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def rules() -> RulesLayer:
    return RulesLayer(ContextServeConfig())


@pytest.mark.parametrize(
    "command",
    [
        "ls", "ls -la src/", "cat setup.py", "pwd", "head -n 50 a.py", "tail -20 log.txt", "echo hi",
        "wc -l *.py", "grep -n foo a.py b.py", "find . -maxdepth 2 -name '*.py'", "git status",
        "git diff --stat", "git log --oneline -5", "git --no-pager show HEAD", "git branch -a",
        "sed -n '1,20p' a.py", "which python", "env", "cd repo && ls -la", "cat a.py | grep def | head",
        "sudo ls /root", "FOO=1 ls", "python --version", "sleep 0.5", "timeout 1 make",
        "export X=1; cd /tmp; ls",
    ],
)
def test_rules_fast(rules, command):
    prediction = rules.predict(call(command))
    assert prediction is not None and prediction.speed is FAST, command
    assert 0 < prediction.ttl_s <= 60 and prediction.layer == "rules"


@pytest.mark.parametrize(
    "command",
    [
        "make", "make -j8 all", "cmake --build build", "pip install -r requirements.txt", "pip3 install numpy",
        "python -m pip install -e .", "npm install", "cargo build --release", "docker build -t x .",
        "sudo apt-get install -y curl", "pytest", "pytest -x tests/", "python -m pytest -q", "python3.11 -m pytest",
        "tox -e py311", "mvn package", "./gradlew build", "go test ./...", "sleep 30", "sleep 1m",
        "ls && make test", "cd repo && pip install -e . && pytest", "sleep 6 && sleep 6",
        "timeout 60 make",
    ],
)
def test_rules_slow(rules, command):
    prediction = rules.predict(call(command))
    assert prediction is not None and prediction.speed is SLOW, command
    assert prediction.ttl_s == 0.0


@pytest.mark.parametrize(
    "command",
    [
        "python train.py", "grep -rn TODO .", "find . -name '*.py'", "ls -R /", "sed -i 's/a/b/' f",
        "tail -f log", "pytest tests/test_a.py::test_x", "python -m pytest -k slow", "curl http://x",
        "ls $(find / -name x)", "ls && python x.py", "for f in *; do cat $f; done", "go test ./pkg",
        "timeout 5 make", "python -c 'print(1)'",
    ],
)
def test_rules_abstain(rules, command):
    assert rules.predict(call(command)) is None, command


def test_rules_duration_between_thresholds_is_uncertain(rules):
    prediction = rules.predict(call("sleep 5"))
    assert prediction is not None and prediction.speed is UNCERTAIN
    assert prediction.predicted_seconds == pytest.approx(5.0)


def test_rules_fast_ttl_and_chain_ttl(rules):
    assert rules.predict(call("ls")).ttl_s == pytest.approx(1.0)
    # sleep d adds its own hint TTL (d * 1.2 + 0.05) to the chain's rule TTL
    assert rules.predict(call("ls && sleep 0.5")).ttl_s == pytest.approx(1.0 + 0.65)
    assert rules.predict(call("sleep 1.5 && sleep 1.5")) .speed is UNCERTAIN  # 3 s in total


def test_rules_override_file_wins_and_adds(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({
        "fast_ttl_s": 2.5,
        "rules": [
            {"match": "ls", "class": "slow", "comment": "a huge NFS mount"},
            {"match": "mytool check", "class": "fast", "ttl_s": 0.7},
            {"match": "git status", "class": "abstain"},
            {"match": "python train.py", "class": "slow"},
        ],
    }))
    layer = RulesLayer(ContextServeConfig(rules_path=str(path)))
    assert layer.predict(call("ls -la")).speed is SLOW
    assert layer.predict(call("mytool --verbose check x")).ttl_s == pytest.approx(0.7)
    assert layer.predict(call("mytool run")) is None
    assert layer.predict(call("git status")) is None
    assert layer.predict(call("cat a")).ttl_s == pytest.approx(2.5)  # file-level fast_ttl_s
    assert layer.predict(call("python train.py --epochs 3")).speed is SLOW
    assert layer.predict(call("make")).speed is SLOW  # defaults still apply
    replaced = tmp_path / "only.json"
    replaced.write_text(json.dumps({"replace_defaults": True, "rules": [{"match": "ls", "class": "fast"}]}))
    only = RulesLayer(ContextServeConfig(rules_path=str(replaced)))
    assert only.predict(call("ls")).speed is FAST and only.predict(call("make")) is None


@pytest.mark.parametrize(
    "document, needle",
    [
        ({"rules": [{"match": "ls", "class": "fast"}, {"match": "make", "class": "slowish"}]}, "rules[1]"),
        ({"rules": [{"match": "ls", "clas": "fast"}]}, "unknown key"),
        ({"rules": [{"match": "", "class": "fast"}]}, "'match'"),
        ({"rules": [{"match": "make", "class": "slow", "ttl_s": 3}]}, "'ttl_s'"),
        ({"rules": [{"match": "ls", "class": "fast", "ttl_s": -1}]}, "'ttl_s'"),
        ({"rules": [{"match": "ls", "class": "fast", "forbid": "-R"}]}, "'forbid'"),
        ({"rules": {"match": "ls"}}, "'rules' must be a list"),
        ({"version": 2, "rules": []}, "version"),
        ({"rulez": []}, "unknown top-level"),
        ({"tools": [{"name": "Read", "class": "fast"}, {"name": "Task", "class": "duration"}]}, "tools[1]"),
        ({"tools": [{"name": "Read", "class": "fast", "match": "x"}]}, "unknown key"),
        ({"tools": [{"name": "two words", "class": "fast"}]}, "'name'"),
        ({"tools": [{"name": "Task", "class": "slow", "ttl_s": 3}]}, "'ttl_s'"),
        ({"tools": {"name": "Read"}}, "'tools' must be a list"),
    ],
)
def test_malformed_rules_file_names_file_and_entry(tmp_path, document, needle):
    path = tmp_path / "bad_rules.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RulesFileError) as err:
        RulesLayer(ContextServeConfig(rules_path=str(path)))
    assert str(path) in str(err.value) and needle in str(err.value)


def test_rules_file_invalid_json_and_missing(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(RulesFileError, match="invalid JSON"):
        load_rule_set(bad)
    with pytest.raises(RulesFileError, match="cannot be read"):
        load_rule_set(tmp_path / "missing.json")


def test_shipped_rules_load():
    rule_set = load_rule_set()
    assert len(rule_set) > 50 and data_path("default_rules.json").is_file()


def test_parse_simple_command_wrappers():
    cmd = parse_simple_command("sudo -u bob env FOO=1 nice -n 5 timeout -k 2 30s python3 -m pytest -q")
    assert cmd.program == "python" and cmd.args == ("-m", "pytest", "-q")
    assert cmd.sudo and cmd.timeout_s == 30.0
    assert parse_duration("2m") == 120 and parse_duration("infinity") == math.inf and parse_duration("x") is None



# ----------------------------------------------------------------------
# Seeded priors for agent clients' tool names (the rules file's "tools")
# ----------------------------------------------------------------------
def hermes_call(name: str, arguments: str = "{}") -> ToolCall:
    parsed = extract_tool_call(f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>')
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    "name",
    ["Task", "WebFetch", "WebSearch", "AskUserQuestion", "task", "webfetch", "web_fetch", "google_web_search",
     "ask_followup_question", "visit_webpage"],
)
def test_seeded_slow_tools(rules, name):
    prediction = rules.predict(hermes_call(name))
    assert prediction is not None and prediction.speed is SLOW and prediction.ttl_s == 0.0, name


@pytest.mark.parametrize(
    "name",
    ["Read", "Grep", "Glob", "Edit", "MultiEdit", "Write", "TodoWrite", "NotebookEdit", "LS",
     "apply_patch", "update_plan", "str_replace_editor", "read_file", "search_file_content", "replace_in_file"],
)
def test_seeded_fast_tools(rules, name):
    prediction = rules.predict(hermes_call(name, '{"file_path": "a.py"}'))
    assert prediction is not None and prediction.speed is FAST, name
    assert prediction.ttl_s == pytest.approx(1.0) and prediction.layer == "rules"


def test_unknown_tools_and_shell_tools_are_not_named_rules(rules):
    assert rules.predict(hermes_call("my_custom_tool")) is None
    # Claude Code's Bash is a shell: its command decides, not its name.
    assert rules.predict(hermes_call("Bash", '{"command": "ls -la"}')).speed is FAST
    assert rules.predict(hermes_call("Bash", '{"command": "pip install torch"}')).speed is SLOW
    # Codex's shell with an argv list, and its apply_patch run through it.
    assert rules.predict(hermes_call("shell", '{"command": ["bash", "-lc", "git status"]}')).speed is FAST
    assert rules.predict(hermes_call("shell", '{"command": ["apply_patch", "*** Begin Patch"]}')).speed is FAST


def test_code_actions_are_classified_by_the_tools_they_call(rules):
    search = extract_tool_call("Thought: look it up.\n<code>\nprint(web_search(query='x'))\n")
    assert rules.predict(search).speed is SLOW
    # Any slow tool makes the action slow; all fast tools make it fast.
    mixed = extract_tool_call("<code>\nfoo = read_file('a')\nweb_search(foo)\n</code>")
    assert rules.predict(mixed).speed is SLOW
    fast = extract_tool_call("<code>\nread_file('a')\nwrite_file('b', 'x')\n</code>")
    assert rules.predict(fast).speed is FAST
    # Plain Python or an unknown tool: the learned layers decide.
    assert rules.predict(extract_tool_call("<code>\nprint(2 ** 10)\n</code>")) is None
    assert rules.predict(extract_tool_call("<code>\nread_file('a'); my_tool()\n</code>")) is None


def test_tool_rules_override_file_wins(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"tools": [
        {"name": "grep", "class": "slow", "comment": "a monorepo"},
        {"name": "Task", "class": "abstain"},
        {"name": "my_tool", "class": "fast", "ttl_s": 0.4, "seconds": 0.2},
    ]}))
    layer = RulesLayer(ContextServeConfig(rules_path=str(path)))
    assert layer.predict(hermes_call("Grep")).speed is SLOW  # names compare case-insensitively
    assert layer.predict(hermes_call("Task")) is None
    mine = layer.predict(hermes_call("my_tool"))
    assert mine.speed is FAST and mine.ttl_s == pytest.approx(0.4) and mine.predicted_seconds == pytest.approx(0.2)
    assert layer.predict(hermes_call("Read")).speed is FAST  # defaults still apply


def test_seeded_fast_tool_ttl_adds_the_round_trip_in_the_predictor():
    predictor = ContextAwarePredictor(ContextServeConfig(refit_every=10_000), fallback)
    try:
        ctx = TTLContext(tool_key="Read", context_tokens=1000, queueing_delay_s=1.0, eta=1.0, round_trip_s=1.5)
        read = predictor.predict(hermes_call("Read", '{"file_path": "a.py"}'), ctx)
        assert (read.speed, read.layer) == (FAST, "rules") and read.ttl_s == pytest.approx(1.0 + 1.5)
        task = predictor.predict(hermes_call("Task", '{"prompt": "go"}'), ctx)
        assert (task.speed, task.layer, task.ttl_s) == (SLOW, "rules", 0.0)
    finally:
        predictor.close()
