import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

# ----------------------------------------------------------------------
# Test levels
# ----------------------------------------------------------------------
# Every test has exactly one level marker (registered in pyproject.toml), so
# that e.g. `pytest -m unit` runs only the fast tests:
#   unit      pure Python (and vLLM's data types): no scheduler, engine or server;
#   scheduler drives a real vLLM Scheduler in-process, without model weights
#             (benchmarks/engine_rig.py, the simulator);
#   engine    starts an in-process vLLM engine with a model (LLM(...));
#   e2e       starts a real `vllm serve` (slow, ~1 min per server).
# Each test file gets its level here; a test (or a module's `pytestmark`)
# that carries a level marker itself keeps that one instead. A new test file
# must be added to FILE_LEVELS: tests/test_test_levels.py fails otherwise.
LEVELS = ("unit", "scheduler", "engine", "e2e")

FILE_LEVELS = {
    "test_ab_smoke.py": "e2e",
    "test_admission.py": "scheduler",
    "test_agent_loop.py": "unit",
    "test_agent_replay.py": "unit",
    "test_aiperf_replay.py": "unit",
    "test_aiperf_report.py": "unit",
    "test_capacity_report.py": "unit",
    "test_server_preflight.py": "unit",
    "test_block_copier.py": "unit",
    "test_connector.py": "engine",
    "test_context_predictor.py": "unit",
    "test_conversations.py": "unit",
    "test_prompt_prefix.py": "unit",
    "test_dashboard.py": "unit",
    "test_device_step_timing.py": "unit",
    "test_docs_links.py": "unit",
    "test_dtype.py": "unit",
    "test_e2e_agent_clients.py": "e2e",
    "test_scripted_replies.py": "unit",
    "test_e2e_context_serve.py": "e2e",
    "test_e2e_mini_swe_agent.py": "e2e",
    "test_e2e_prompt_embeds.py": "e2e",
    "test_e2e_router.py": "e2e",
    "test_e2e_server.py": "e2e",
    "test_e2e_retention.py": "e2e",
    "test_e2e_session_headers.py": "e2e",
    "test_estimators.py": "unit",
    "test_eviction_order.py": "scheduler",
    "test_final_answer.py": "scheduler",
    "test_implicit_jobs.py": "unit",
    "test_implicit_scheduler.py": "scheduler",
    "test_job_order.py": "scheduler",
    "test_import_graph.py": "unit",
    "test_lmcache.py": "e2e",
    "test_metadata_and_config.py": "unit",
    "test_native_calls.py": "unit",
    "test_native_offload.py": "e2e",
    "test_offline_llm.py": "engine",
    "test_offload_parts.py": "unit",
    "test_offload_backend.py": "scheduler",
    "test_parser.py": "unit",
    "test_queue_and_registration.py": "scheduler",
    "test_rules_layer.py": "unit",
    "test_scheduler.py": "scheduler",
    "test_session_ids.py": "unit",
    "test_sim_clients.py": "scheduler",
    "test_clients_report.py": "unit",
    "test_sim_cpu_fit.py": "unit",
    "test_sim_offload.py": "unit",
    "test_sim_step_model.py": "unit",
    "test_sim_traces.py": "unit",
    "test_simulate.py": "scheduler",
    "test_stats.py": "unit",
    "test_step_budget.py": "scheduler",
    "test_sub_agents.py": "scheduler",
    "test_prefill_chunks.py": "scheduler",
    "test_turn_room.py": "scheduler",
    "test_backfill.py": "scheduler",
    "test_host_tier_order.py": "scheduler",
    "test_prefetch.py": "scheduler",
    "test_real_traffic.py": "scheduler",
    "test_retention.py": "unit",
    "test_retention_scheduler.py": "scheduler",
    "test_test_levels.py": "unit",
    "test_threat_implicit_jobs.py": "scheduler",
    "test_threat_job_binding.py": "scheduler",
    "test_threat_job_memory.py": "scheduler",
    "test_threat_parsing.py": "unit",
    "test_threat_scoped_learning.py": "scheduler",
    "test_threat_settings.py": "unit",
    "test_turn_outcome.py": "unit",
    "test_workload.py": "unit",
}

# nodeid -> the level markers each collected test ended up with (all of them,
# before `-m` deselects any); tests/test_test_levels.py checks it.
COLLECTED_LEVELS = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    levels = {}
    for item in items:
        own = [m.name for m in item.iter_markers() if m.name in LEVELS]
        if not own:
            level = FILE_LEVELS.get(item.path.name)
            if level is not None:
                item.add_marker(getattr(pytest.mark, level))
                own = [level]
        levels[item.nodeid] = sorted(set(own))
    config.stash[COLLECTED_LEVELS] = levels
