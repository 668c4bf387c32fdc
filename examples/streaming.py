"""StreamingLLM (Xiao et al.) written in numpy: the first `sinks` tokens of the prompt and the most
recent ones, in every head. Its kept sets equal the C++ streamingllm's (python/tests), which makes it
the yardstick of what the Python boundary costs (python_vs_cpp.py)."""
import numpy as np

import kvbench


class Streaming(kvbench.Method):
    """attention sinks + most recent tokens, in numpy"""

    params = {"sinks": 4}

    def compress(self, view, budget):
        sinks = self.params["sinks"]
        keep = np.r_[np.arange(sinks), np.arange(view.n_tokens - (budget - sinks), view.n_tokens)]
        return np.tile(keep, (view.stored_heads, 1))  # positions [stored_heads, budget]
