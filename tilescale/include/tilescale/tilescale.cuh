// tilescale/tilescale.cuh: the one header tilescale's code generator includes in distributed kernels.
#pragma once
#include <tilescale/module.cuh>
#include <tilescale/ops.cuh>
#include <tilescale/profile.cuh>
