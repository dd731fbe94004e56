"""tilescale's version, and the torch versions its tests cover (setup.py reads both from here; the doctor warns
outside that range)."""

__version__ = "0.1.0"

# torch: tilescale relies on private torch APIs (tilescale/compat.py). Tested with 2.11 on the GPU machines and 2.14
# in CI (the CPU tier, .ci/run); raise the bound once the tests ran on a newer one.
TORCH_LOWEST = "2.11"        # the lowest version tested
TORCH_BELOW = "2.15"         # the first version not tested
TORCH_REQUIREMENT = f"torch>={TORCH_LOWEST},<{TORCH_BELOW}"
