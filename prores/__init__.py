"""prores: training very deep transformers with Progressive Residual Warmup."""

__version__ = "0.1.0"
