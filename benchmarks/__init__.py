"""Benchmarks and demos for vllm-continuum-plugin.

Installed as ``vllm_continuum_plugin.benchmarks`` (the repository keeps the
folder at the top level). ``server`` starts and stops a real ``vllm serve``;
``demo`` is the README's main job; ``scheduler_overhead`` measures the
plugin's cost on the scheduler's hot path.
"""
