"""Key-norm selection written in Python (Devoto et al., 2024, "A Simple and Effective L2 Norm-Based
Strategy for KV Cache Compression"): keys of low L2 norm draw high attention, so each KV head keeps the
prompt tokens whose keys have the smallest norms, plus the most recent `window` tokens.

Specs name it as python:keynorm.KeyNorm (with this folder on PYTHONPATH); keynorm_sweep.py runs it.
"""
import numpy as np

import kvbench


class KeyNorm(kvbench.Method):
    """keep the tokens whose keys have the lowest L2 norm (Devoto et al., 2024)"""

    params = {"window": 8}

    def compress(self, view, budget):
        w = self.params["window"]
        keys = view.keys[: view.n_tokens - w]  # [S - w, n_kv_heads, head_dim], a view of the engine's rows
        # Per-token scores for the shared top-k: the lowest norms score highest.
        return -np.linalg.norm(keys, axis=2).T
