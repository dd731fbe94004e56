"""tilescale: a JIT compiler for distributed tile kernels on NVIDIA GPUs (tilelang + NVSHMEM).

    pip install -e ".[cu13,test]"      # CUDA 13; CUDA 12: see the README (a torch built for CUDA 12)
"""
from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
about: dict = {}
exec((here / "tilescale" / "version.py").read_text(), about)   # version and torch range, without importing tilescale

setup(
    name="tilescale",
    version=about["__version__"],
    description="JIT compiler for distributed tile kernels (tilelang + NVSHMEM) on NVIDIA GPUs",
    long_description=(here / "README.md").read_text() if (here / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tilescale", "tilescale.*"]),
    package_data={"tilescale": ["include/tilescale/*.cuh", "csrc/*.cu", "plan/tuning/*.json", "ops/*.json"]},
    install_requires=[
        "tilelang>=0.1.15,<0.1.16",   # tested with 0.1.15: its public hooks and the internals in tilescale/compat.py
        about["TORCH_REQUIREMENT"],   # the versions the tests cover (tilescale/version.py)
        "cython>=3.0",
        "numpy",
    ],
    extras_require={
        # one NVSHMEM wheel per CUDA major; torch pins its own, which must be the same one (for CUDA 12: a torch
        # built for CUDA 12, from PyTorch's index, with constraints/cu12.txt)
        "cu13": ["nvidia-nvshmem-cu13>=3.4,<4"],
        "cu12": ["nvidia-nvshmem-cu12>=3.4,<4"],
        "test": ["pytest>=8", "pytest-timeout", "matplotlib",   # matplotlib: the profiler timeline test
                 "ruff>=0.17,<0.18"],                          # .ci/run's lint step (pyproject.toml)
        "bench": ["matplotlib"],
    },
    entry_points={"console_scripts": ["tilescale=tilescale.__main__:main"]},
)
