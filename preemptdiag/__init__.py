"""preemptdiag: diagnose KV-cache preemption and memory incidents in LLM serving logs."""

# The single source of the version (pyproject reads it): importlib.metadata would
# cost ~60 ms on every start, and `--help` must stay fast.
__version__ = "0.1.0"

__all__ = ["__version__"]
