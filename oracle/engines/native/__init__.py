"""The native reference engine (Qwen3 / Llama in plain torch)."""

from oracle.engines.native.engine import NativeEngine

__all__ = ["NativeEngine"]
