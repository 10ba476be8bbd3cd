"""Supported vLLM range, checked where the plugin activates."""

from __future__ import annotations

import re

__version__ = "0.1.0"

# Hooks are verified against these releases; the scheduler-class interface
# is not public, so anything else is refused rather than half-working.
SUPPORTED_VLLM_MIN = (0, 32)
SUPPORTED_VLLM_MAX_EXCLUSIVE = (0, 34)
SUPPORTED_RANGE_TEXT = ">=0.32,<0.34"


class UnsupportedVLLMVersion(RuntimeError):
    pass


def parse_release(version: str) -> tuple[int, int]:
    match = re.match(r"^\s*(\d+)\.(\d+)", version)
    if match is None:
        raise UnsupportedVLLMVersion(
            f"cannot parse vLLM version {version!r}; vllm-continuum-plugin "
            f"{__version__} supports vLLM {SUPPORTED_RANGE_TEXT}"
        )
    return int(match.group(1)), int(match.group(2))


def check_vllm_version(version: str) -> None:
    """Raise ``UnsupportedVLLMVersion`` naming both versions when out of range."""
    release = parse_release(version)
    if not (SUPPORTED_VLLM_MIN <= release < SUPPORTED_VLLM_MAX_EXCLUSIVE):
        raise UnsupportedVLLMVersion(
            f"vllm-continuum-plugin {__version__} supports vLLM "
            f"{SUPPORTED_RANGE_TEXT}, but vLLM {version} is installed. "
            "Install a supported vLLM, or uninstall the plugin."
        )
