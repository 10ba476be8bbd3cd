"""The scheduling policies the plugin adds to vLLM's ``--scheduling-policy``.

A leaf module (it imports nothing): ``registration`` adds these names to
vLLM's ``SchedulerConfig.policy``, and ``scheduler`` / ``api_metadata`` ask
whether an engine runs one of them, without importing each other.
"""

from __future__ import annotations

__all__ = ["PLUGIN_POLICIES"]

PLUGIN_POLICIES = ("continuum", "context_serve")
