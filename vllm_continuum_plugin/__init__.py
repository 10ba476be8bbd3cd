"""vllm-continuum-plugin: multi-turn agent scheduling for stock vLLM.

``vllm serve MODEL --scheduling-policy continuum`` (or ``context_serve``)
after ``pip install``; see README.md. Importing this package is cheap: the
scheduler and vLLM-facing modules load only when vLLM asks for them.
"""

from ._version import SUPPORTED_RANGE_TEXT, __version__
from .policies import PLUGIN_POLICIES
from .registration import register

__all__ = ["PLUGIN_POLICIES", "SUPPORTED_RANGE_TEXT", "__version__", "register"]
