"""Estimators for the Continuum scheduling policies.

Installed as ``vllm_continuum_plugin.estimators`` (the repository keeps the
folder at the top level): tool-call parsing (``parser``), tool-duration and
job histories (``history``), the rebuild-cost model (``prefill``) and the TTL
policies (``ttl``). Pure Python + numpy; nothing here imports vLLM.
"""
