"""Step models by name: what ``--step-model`` picks.

A module of its own so that ``step_model`` (the models) and the optional
``aiconfigurator_model`` (which takes its PCIe constants from
``step_model``) do not import each other.
"""

from __future__ import annotations

from .profiles import SimProfile
from .step_model import STEP_MODEL_KINDS, CpuStepModel, RooflineStepModel, StepModel

__all__ = ["make_step_model"]


def make_step_model(kind: str, profile: SimProfile, *, cpu_fit_path: str | None = None) -> StepModel:
    """The step model called ``kind`` for ``profile``.

    ``"roofline"``: :class:`RooflineStepModel`; ``"aiconfigurator"``:
    ``AiconfiguratorStepModel`` (needs the ``sim`` extra, imported only
    then); ``"cpu"``: the :class:`CpuStepModel` stored at ``cpu_fit_path``
    (it was fitted to one live engine, so ``profile`` does not change it).
    """
    if kind == "roofline":
        return RooflineStepModel(profile)
    if kind == "aiconfigurator":
        from .aiconfigurator_model import AiconfiguratorStepModel

        return AiconfiguratorStepModel(profile)
    if kind == "cpu":
        if not cpu_fit_path:
            raise ValueError("step model 'cpu' needs cpu_fit_path (a CpuStepModel JSON file)")
        return CpuStepModel.load(cpu_fit_path)
    raise ValueError(f"unknown step model kind {kind!r}; choose one of {', '.join(STEP_MODEL_KINDS)}")
