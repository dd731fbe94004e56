"""tilescale: a JIT compiler for distributed tile kernels on NVIDIA GPUs (tilelang + NVSHMEM).

    pip install -e ".[cu13,test]"      # CUDA 13 (or .[cu12] for CUDA 12)
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
version = re.search(r'__version__ = "([^"]+)"', (here / "tilescale" / "version.py").read_text()).group(1)

setup(
    name="tilescale",
    version=version,
    description="JIT compiler for distributed tile kernels (tilelang + NVSHMEM) on NVIDIA GPUs",
    long_description=(here / "README.md").read_text() if (here / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tilescale", "tilescale.*"]),
    package_data={"tilescale": ["include/tilescale/*.cuh", "csrc/*.cu", "plan/tuning/*.json", "ops/*.json"]},
    install_requires=[
        "tilelang>=0.1.15,<0.1.16",   # tested with 0.1.15: its public hooks and the internals in tilescale/compat.py
        "torch>=2.9",
        "cython>=3.0",
        "numpy",
    ],
    extras_require={
        "cu13": ["nvidia-nvshmem-cu13>=3.4,<4"],
        "cu12": ["nvidia-nvshmem-cu12>=3.4,<4"],
        "test": ["pytest>=8", "pytest-timeout", "matplotlib",   # matplotlib: the profiler timeline test
                 "ruff>=0.17,<0.18"],                          # .ci/run's lint step (pyproject.toml)
        "bench": ["matplotlib"],
    },
    entry_points={"console_scripts": ["tilescale=tilescale.__main__:main"]},
)
