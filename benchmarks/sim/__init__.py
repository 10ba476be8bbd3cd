"""A deterministic GPU-scale replay of agent traffic through vLLM's real scheduler.

The simulator drives vLLM's own v1 ``Scheduler`` and ``KVCacheManager`` (and
the plugin's ``continuum`` / ``context_serve`` schedulers on top of them) with
no model: time is a virtual :class:`~vllm_continuum_plugin.clock.ManualClock`,
each scheduled batch costs what a step-time model says it would cost on a GPU,
and each finished turn queues its job's next turn after the recorded tool time.

Modules, one concept each:

* ``batch`` -- :class:`BatchShape`, what a step-time model sees of a step;
* ``step_model`` -- the :class:`StepModel` interface, the dependency-free
  roofline model and the CPU model fitted from a live engine;
* ``aiconfigurator_model`` -- NVIDIA aiconfigurator's measured vLLM data
  behind the same interface (optional extra ``sim``);
* ``profiles`` -- GPU + model profiles (H100 with Llama-3.1-8B TP1, 70B TP4):
  engine limits and KV pool sizes;
* ``traces`` -- the kv-cache-tester (Claude Code) trace format;
* ``jobs`` -- the simulator's jobs and turns, from traces or the synthetic
  presets, and the tokens their prompts are made of;
* ``engine`` -- the replay loop;
* ``arms`` -- the policies compared in one run;
* ``offload`` -- the offload connectors' workers in simulation (the
  plugin's synchronous copies; vLLM's native ``OffloadingConnector``'s
  asynchronous ones on the virtual clock);
* ``report`` -- per-run summaries, sweeps and plots;
* ``trace_stats``, ``cpu_fit``, ``validate`` -- trace statistics, the CPU
  step-model fit and the validation against the live engine.
"""
