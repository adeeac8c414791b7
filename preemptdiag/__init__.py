"""preemptdiag: diagnose KV-cache preemption and memory incidents in LLM serving logs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("preemptdiag")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
