"""Benchmarks and demos for vllm-continuum-plugin.

Installed as ``vllm_continuum_plugin.benchmarks`` (the repository keeps the
folder at the top level). ``server`` starts and stops a real ``vllm serve``;
``demo`` is the README's main job; ``scheduler_overhead`` measures the
plugin's cost on the scheduler's hot path.

Modules by concept (nothing here imports from ``tests/``):

* workloads and traces -- ``workload`` (the public surface and its CLI) over
  ``workload_jobs``, ``workload_tool_times``, ``workload_spec``,
  ``workload_presets``, ``workload_traces`` and ``workload_checks``;
  ``aiperf_traces``; the simulator's ``sim/``;
* the agent loop -- ``agent_loop`` (the loop and its CLI) over
  ``agent_task`` (prompts, workspace), ``agent_commands`` (policy, runner),
  ``agent_client`` (the server) and ``agent_results`` (turns, trace,
  summary); ``agent_replay`` replays a workload as agents;
* the engine rig -- ``engine_rig``: a real vLLM ``Scheduler`` in-process
  without weights, used by ``scheduler_overhead`` (``overhead_step``,
  ``overhead_ttl``, ``timing``) and re-exported by ``tests/harness.py``;
* the A/B runners -- ``ab_benchmark``, ``router_ab``, ``mswea_ab``,
  ``aiperf_replay``, ``simulate``.
"""
