"""Entry point of the ``vllm.general_plugins`` group.

vLLM calls ``register()`` once per process (API server, EngineCore, workers)
before it builds ``--scheduling-policy``'s choices. It must be idempotent and
cheap, so it imports only what vLLM has already imported and defers the rest:

1. refuses unsupported vLLM releases with an error naming both versions;
2. adds ``continuum`` and ``context_serve`` to ``SchedulerConfig.policy`` (the
   pydantic Literal and the cached argparse choices) and makes
   ``get_scheduler_cls`` return the plugin scheduler for them -- the async
   variant when vLLM runs async scheduling -- unless ``--scheduler-cls`` is
   given explicitly;
3. installs a post-import hook that patches the OpenAI protocol classes when
   (and only if) the process imports them, for the top-level metadata fields,
   and vLLM's session-id lookup (plus the ``/v1/messages`` conversion) for
   the session ids harnesses send (``session_ids``);
4. exports the engine's plugin metrics on the API server's ``/metrics``.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

from ._version import check_vllm_version
from .policies import PLUGIN_POLICIES

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["register", "PLUGIN_POLICIES"]

_lock = threading.Lock()
_registered = False

# module name -> function patching it once it has been executed
_POST_IMPORT_PATCHES: dict[str, Callable[[ModuleType], None]] = {}


def register() -> None:
    global _registered
    with _lock:
        if _registered:
            return
        import vllm

        check_vllm_version(getattr(vllm, "__version__", "0.0"))
        _register_policies()
        _register_connector()
        _install_post_import_patches()
        _register_metrics_collector()
        _registered = True


# ----------------------------------------------------------------------
# Policies
# ----------------------------------------------------------------------
def _register_policies() -> None:
    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import scheduler as scheduler_config_module
    from vllm.config.scheduler import SchedulerConfig

    field = SchedulerConfig.__dataclass_fields__["policy"]
    current = tuple(getattr(field.type, "__args__", ()) or ("fcfs", "priority"))
    if all(p in current for p in PLUGIN_POLICIES):
        return
    extended = Literal[tuple(dict.fromkeys(current + PLUGIN_POLICIES))]  # type: ignore[valid-type]
    field.type = extended
    SchedulerConfig.__annotations__["policy"] = extended
    scheduler_config_module.SchedulerPolicy = extended  # type: ignore[attr-defined]
    rebuild_dataclass(SchedulerConfig, force=True)  # type: ignore[arg-type]

    arg_utils = sys.modules.get("vllm.engine.arg_utils")
    if arg_utils is not None and hasattr(arg_utils, "_compute_kwargs"):
        _document_policies_in_help(arg_utils, SchedulerConfig)
        arg_utils._compute_kwargs.cache_clear()  # argparse choices are cached

    original = SchedulerConfig.get_scheduler_cls

    def get_scheduler_cls(self: Any) -> type:
        if self.scheduler_cls is None and self.policy in PLUGIN_POLICIES:
            from .scheduler import ContinuumAsyncScheduler, ContinuumScheduler

            return ContinuumAsyncScheduler if self.async_scheduling else ContinuumScheduler
        return original(self)

    get_scheduler_cls.__doc__ = original.__doc__
    SchedulerConfig.get_scheduler_cls = get_scheduler_cls  # type: ignore[method-assign]


POLICY_HELP = (
    '\n- "continuum" (vllm-continuum-plugin) keeps a finished non-final agent '
    "turn's KV cache pinned for a TTL predicted from its tool call and orders "
    "requests by job; tag requests with job_id / is_last_step."
    '\n- "context_serve" (vllm-continuum-plugin) like "continuum", but classifies '
    "each tool call FAST / SLOW / UNCERTAIN: pins FAST, frees SLOW at once, "
    "and gives UNCERTAIN Continuum's TTL."
)


def _document_policies_in_help(arg_utils: ModuleType, config_cls: type) -> None:
    """``--help`` renders field docstrings parsed from vLLM's source; append
    the plugin's policies to the ``policy`` field's text."""
    original = getattr(arg_utils, "get_attr_docs", None)
    if original is None or getattr(original, "_continuum_patched", False):
        return

    def get_attr_docs(cls: type) -> dict[str, str]:
        docs = original(cls)
        if cls is config_cls and "policy" in docs and "continuum" not in docs["policy"]:
            docs = {**docs, "policy": docs["policy"] + POLICY_HELP}
        return docs

    get_attr_docs._continuum_patched = True  # type: ignore[attr-defined]
    arg_utils.get_attr_docs = get_attr_docs


def _register_connector() -> None:
    """Let users name ``ContinuumOffloadConnector`` (and, for vLLM's own
    ``OffloadingConnector`` on CPU, the ``CPUPlatformOffloadingSpec`` spec)
    without a module path."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except Exception:  # layout differs: the module-path spelling still works
        return
    name = "ContinuumOffloadConnector"
    if name not in getattr(KVConnectorFactory, "_registry", {}):
        KVConnectorFactory.register_connector(
            name, "vllm_continuum_plugin.connectors.kv_offload", "ContinuumOffloadConnector"
        )
    # vLLM's own OffloadingConnector on the CPU platform: a new spec name,
    # used only where a --kv-transfer-config names it.
    try:
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    except Exception:
        return
    spec = "CPUPlatformOffloadingSpec"
    if spec not in getattr(OffloadingSpecFactory, "_registry", {}):
        OffloadingSpecFactory.register_spec(spec, "vllm_continuum_plugin.connectors.native_offload", spec)


# ----------------------------------------------------------------------
# Post-import hook for API-process-only patches
# ----------------------------------------------------------------------
def _patch_protocol(module: ModuleType) -> None:
    from .api_metadata import patch_request_class

    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest"):
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            patch_request_class(cls)


def _patch_session_lookup(module: ModuleType) -> None:
    from .api_metadata import patch_session_lookup

    cls = getattr(module, "GenerateBaseServing", None)
    if isinstance(cls, type):
        patch_session_lookup(cls)


def _patch_anthropic_messages(module: ModuleType) -> None:
    from .api_metadata import patch_anthropic_messages

    cls = getattr(module, "AnthropicServingMessages", None)
    if isinstance(cls, type):
        patch_anthropic_messages(cls)


def _patch_anthropic_protocol(module: ModuleType) -> None:
    from .api_metadata import keep_extra_fields

    cls = getattr(module, "AnthropicMessagesRequest", None)
    if isinstance(cls, type):
        keep_extra_fields(cls)


def _patch_metrics_router(module: ModuleType) -> None:
    """With several API servers vLLM serves /metrics from a multiprocess
    registry instead of the default one; add our collector there too."""
    original = getattr(module, "get_prometheus_registry", None)
    if original is None or getattr(original, "_continuum_patched", False):
        return

    def get_prometheus_registry() -> Any:
        registry = original()
        from prometheus_client import REGISTRY

        if registry is not REGISTRY:
            collector = _snapshot_collector()
            if collector is not None:
                registry.register(collector)
        return registry

    get_prometheus_registry._continuum_patched = True  # type: ignore[attr-defined]
    module.get_prometheus_registry = get_prometheus_registry


_POST_IMPORT_PATCHES.update(
    {
        "vllm.entrypoints.openai.chat_completion.protocol": _patch_protocol,
        "vllm.entrypoints.openai.completion.protocol": _patch_protocol,
        "vllm.entrypoints.openai.responses.protocol": _patch_protocol,
        "vllm.entrypoints.generate.base.serving": _patch_session_lookup,
        "vllm.entrypoints.anthropic.protocol": _patch_anthropic_protocol,
        "vllm.entrypoints.anthropic.serving": _patch_anthropic_messages,
        "vllm.entrypoints.serve.instrumentator.metrics": _patch_metrics_router,
    }
)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs a patch right after a watched module finishes executing."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = _POST_IMPORT_PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module  # type: ignore[union-attr]

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            _apply_patch(patch, module)

        loader.exec_module = exec_module  # type: ignore[method-assign, union-attr]
        return spec


def _apply_patch(patch: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        patch(module)
    except Exception:  # a failed convenience patch must not break the server
        logger.exception("vllm-continuum-plugin: could not patch %s", module.__name__)


def _install_post_import_patches() -> None:
    for name, patch in _POST_IMPORT_PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            _apply_patch(patch, module)
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


# ----------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------
_collector: Any = None


def _snapshot_collector() -> Any:
    global _collector
    if _collector is None:
        from .metrics import METRICS_DIR_ENV, SnapshotCollector

        directory = os.environ.get(METRICS_DIR_ENV)
        if directory:
            _collector = SnapshotCollector(directory)
    return _collector


def _register_metrics_collector() -> None:
    from .metrics import METRICS_DIR_ENV

    if not os.environ.get(METRICS_DIR_ENV):
        # First process of the server: make the directory the EngineCore
        # (spawned later, inheriting the environment) writes snapshots to.
        directory = tempfile.mkdtemp(prefix="vllm-continuum-metrics-")
        os.environ[METRICS_DIR_ENV] = directory
        creator = os.getpid()

        def _cleanup() -> None:
            if os.getpid() == creator:
                shutil.rmtree(directory, ignore_errors=True)

        atexit.register(_cleanup)
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    collector = _snapshot_collector()
    if collector is not None:
        try:
            REGISTRY.register(collector)
        except ValueError:
            pass  # already registered in this process
