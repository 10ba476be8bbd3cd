"""Compiled inference for ContextServe's classifier: a multi-class XGBoost
booster's trees as flat numpy arrays, evaluated level by level for all trees
at once (several times cheaper than ``Booster.inplace_predict`` on one row).
A compiled forest is checked against the booster on probe rows when built
and not used if they disagree."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

__all__ = ["CompiledForest", "compile_booster"]

logger = logging.getLogger("vllm_continuum_plugin.estimators.xgb_classifier")


class CompiledForest:
    """All trees of a multi-class booster as flat arrays.

    Invariant: for leaves ``left[i] == right[i] == i``, so iterating
    ``depth`` times from the roots lands every tree on its leaf; the margin
    of class c is ``intercept[c] + sum(value[leaf] for trees of class c)``.
    """

    def __init__(self, model: dict[str, Any], num_class: int) -> None:
        gbm = model["learner"]["gradient_booster"]
        if gbm.get("name", "gbtree") != "gbtree":
            raise ValueError(f"unsupported booster {gbm.get('name')!r}")
        trees = gbm["model"]["trees"]
        tree_class = np.asarray(gbm["model"]["tree_info"], dtype=np.int64)
        lefts, rights, feats, conds, roots = [], [], [], [], []
        offset = 0
        depth = 0
        for tree in trees:
            if any(tree.get("split_type", [])) or tree.get("categories"):
                raise ValueError("categorical splits are not supported")
            left = np.asarray(tree["left_children"], dtype=np.int64)
            right = np.asarray(tree["right_children"], dtype=np.int64)
            n = left.size
            idx = np.arange(n, dtype=np.int64)
            leaf = left == -1
            lefts.append(np.where(leaf, idx, left) + offset)
            rights.append(np.where(leaf, idx, right) + offset)
            feats.append(np.where(leaf, 0, np.asarray(tree["split_indices"], dtype=np.int64)))
            conds.append(np.asarray(tree["split_conditions"], dtype=np.float32))
            roots.append(offset)
            depth = max(depth, _tree_depth(left, right))
            offset += n
        self.left = np.concatenate(lefts)
        self.right = np.concatenate(rights)
        self.feature = np.concatenate(feats)
        self.threshold = np.concatenate(conds)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.tree_class = tree_class
        self.depth = depth
        self.num_class = num_class
        self.intercept = np.zeros(num_class)

    def leaf_sums(self, x: np.ndarray) -> np.ndarray:
        node = self.roots
        for _ in range(self.depth):
            go_left = x[self.feature[node]] < self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        return np.bincount(self.tree_class, weights=self.threshold[node], minlength=self.num_class)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return _softmax(self.leaf_sums(x) + self.intercept)


def _tree_depth(left: np.ndarray, right: np.ndarray) -> int:
    depth, frontier = 0, [0]
    while frontier:
        nxt = [c for i in frontier for c in (left[i], right[i]) if c != -1]
        if nxt:
            depth += 1
        frontier = nxt
    return depth


def _softmax(margins: np.ndarray) -> np.ndarray:
    e = np.exp(margins - margins.max())
    return e / e.sum()


def compile_booster(booster: Any, probe: np.ndarray, num_classes: int) -> CompiledForest | None:
    """Compile ``booster``; None (logged) if the compiled forest does not
    reproduce the booster's probabilities on ``probe`` to 1e-5."""
    try:
        forest = CompiledForest(json.loads(bytes(booster.save_raw("json"))), num_classes)
        margins = np.asarray(booster.inplace_predict(probe, predict_type="margin"), dtype=np.float64)
        sums = np.vstack([forest.leaf_sums(row) for row in probe])
        intercepts = margins - sums
        if np.ptp(intercepts, axis=0).max() > 1e-4:
            raise ValueError("intercept differs between probe rows")
        forest.intercept = intercepts[0]
        expected = np.asarray(booster.inplace_predict(probe), dtype=np.float64)
        got = np.vstack([forest.predict_proba(row) for row in probe])
        if np.abs(expected - got).max() > 1e-5:
            raise ValueError(f"max probability error {np.abs(expected - got).max():.2e}")
        return forest
    except Exception as exc:
        logger.info("ContextServe classifier: compiled inference disabled (%s); using the booster", exc)
        return None
