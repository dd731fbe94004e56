"""Can the rdc build mode (``-rdc=true`` + NVSHMEM's device library, the seed's path) keep a Hopper GEMM at full
speed? What nvcc, nvlink, nvJitLink and libNVVM do with a warp-specialised kernel and the NVSHMEM install that
tilescale finds. CPU only: it compiles and links, runs nothing (no GPU, no libcuda).

    python benchmarks/probe_rdc_lto.py [--json out.json]

Under ``-rdc=true`` tilelang's Hopper GEMM runs at 0.80 of its plain build (docs/rdc-lto.md): ptxas
ignores ``setmaxnreg`` (C7504) and serialises wgmma around the calls into libnvshmem_device (C7509). Each step
below prints the tool's own words; docs/rdc-lto.md reads them. The kernel is a stand-in for tilelang's
warp-specialised GEMM: 384 threads, one producer warpgroup giving registers up (``setmaxnreg.dec``), two consumer
warpgroups taking them (``setmaxnreg.inc``), as tilelang's kernels do; C7504 and C7508 are about that instruction.

  1. whole-program compile (the inlined mode's unit): setmaxnreg kept
  2. ``-rdc=true`` with no extern call at all: C7504. Any relocatable unit loses setmaxnreg, whatever it calls
  3. nvcc's device LTO (``-dlto``, nvlink): the link generates PTX for ``.target sm_90``, which has no setmaxnreg
  4. nvJitLink's LTO, LTO IR only: compiled for sm_90a, setmaxnreg kept (the way around step 3)
  5. nvJitLink's LTO with libnvshmem_device.a beside it: C7504 again (a machine-code input keeps the unit relocatable)
  6. what libnvshmem_device.a holds: machine code (SASS) per architecture and PTX for one, no LTO IR
  7. libNVVM (which would turn NVSHMEM's bitcode, libnvshmem_device.bc, into LTO IR): refused, by the bitcode's
     LLVM version
So full speed under rdc needs NVSHMEM's device code as LTO IR (or bitcode libNVVM reads); the pip wheels ship
neither. Re-run this after a CUDA or NVSHMEM upgrade: a step whose answer changed is printed as such.
"""
import argparse
import ctypes
import functools
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilescale import discovery, toolchain  # noqa: E402

KERNEL = r"""
__global__ void __launch_bounds__(384, 1) k(float* x) {
  if (threadIdx.x < 128) { asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n"); x[threadIdx.x] += 1.0f; }
  else { asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n"); x[threadIdx.x] *= 2.0f; }
}
"""
ARCH = ["-gencode", "arch=compute_90a,code=sm_90a"]
LTO_ARCH = ["-gencode", "arch=compute_90a,code=lto_90a"]
NVJITLINK_INPUT_ANY = 10   # nvJitLinkInputType: the linker tells objects, archives and LTO IR apart itself
# what each step showed with CUDA 13.0 / nvJitLink 13.5 / NVSHMEM 3.4.5 (docs/rdc-lto.md): a word of its answer; a
# different answer is printed as CHANGED
EXPECTED = {
    "whole_program": "setmaxnreg kept",
    "rdc_no_call": "C7504",
    "nvlink_dlto": "target sm_90",
    "nvjitlink_lto": "setmaxnreg kept",
    "nvjitlink_lto_nvshmem": "C7504",
    "device_library": "no LTO IR",
    "libnvvm_bitcode": "refused",
}


def ptxas_words(text: str) -> str:
    """The C75xx performance notes of ptxas in `text`, else whether setmaxnreg was kept."""
    notes = sorted(set(re.findall(r"\(C75\d\d\)[^\n]*", text)))
    return "; ".join(notes) if notes else "setmaxnreg kept (no C75xx note)"


def nvcc(args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([toolchain.nvcc_path(), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@functools.cache
def toolkit_root() -> Path:
    """The CUDA toolkit of the nvcc on PATH (its own ``_HERE_``: nvcc may be a wrapper script elsewhere)."""
    r = subprocess.run([toolchain.nvcc_path(), "-dryrun", "-E", "-x", "cu", os.devnull], capture_output=True,
                       text=True, timeout=60)
    m = re.search(r"^#\$ _HERE_=(.+)$", r.stdout + r.stderr, re.M)
    return Path(m.group(1).strip()).parent if m else Path(os.path.realpath(toolchain.nvcc_path())).parent.parent


def shadow_toolkit(tmp: Path) -> Path:
    """nvcc's toolkit, as links, with libnvvm where nvlink's LTO looks for it (``nvvm/lib64``): some CUDA 13 layouts
    (the CI image's) keep it in ``lib/`` only, where -dlto fails earlier with 'elfLink linker library load error'."""
    real = toolkit_root()
    if (real / "nvvm" / "lib64").is_dir():
        return real
    root = tmp / "toolkit"
    (root / "nvvm" / "lib64").mkdir(parents=True)
    for p in real.iterdir():
        if p.name not in ("nvvm", "bin"):
            (root / p.name).symlink_to(p)
    (root / "bin").mkdir()
    for p in (real / "bin").iterdir():      # nvcc finds its tools, nvlink libnvvm, from where it really is: copies
        if p.name in ("nvcc", "nvlink"):
            shutil.copy2(p, root / "bin" / p.name)
        else:
            (root / "bin" / p.name).symlink_to(p)
    for p in (real / "nvvm").iterdir():
        (root / "nvvm" / p.name).symlink_to(p)
    for lib in [*sorted((real / "lib").glob("libnvvm.so*")), *sorted((real / "lib64").glob("libnvvm.so*"))]:
        (root / "nvvm" / "lib64" / "libnvvm.so").symlink_to(lib)
        break
    return root


def find_library(patterns) -> str | None:
    """The first file matching one of `patterns` (globs) in nvcc's toolkit or in site-packages' nvidia wheels."""
    roots = [str(toolkit_root()), *[p for p in sys.path if p.endswith("site-packages")]]
    for pat in patterns:
        for root in roots:
            hits = sorted(glob.glob(os.path.join(root, pat)))
            if hits:
                return hits[-1]
    return None


class NvJitLink:
    """nvJitLink through ctypes (its entry points are versioned: ``__nvJitLinkCreate_13_0`` and so on)."""

    NAMINGS = (("", ""), ("__", "_13_0"), ("__", "_12_0"))   # (prefix, suffix) of the entry points' names

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        found = [n for n in self.NAMINGS if hasattr(self.lib, f"{n[0]}nvJitLinkCreate{n[1]}")]
        if not found:
            raise OSError(f"{path}: no nvJitLinkCreate entry point")
        self.prefix, self.suffix = found[0]

    def fn(self, name):
        return getattr(self.lib, f"{self.prefix}{name}{self.suffix}")

    def link(self, inputs, options) -> tuple[int, str]:
        """(status, error and info logs) of linking the files `inputs` with `options`."""
        h = ctypes.c_void_p()
        opts = [o.encode() for o in options]
        rc = self.fn("nvJitLinkCreate")(ctypes.byref(h), len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if rc:
            return rc, f"nvJitLinkCreate: {rc}"
        try:
            for path in inputs:
                rc = self.fn("nvJitLinkAddFile")(h, NVJITLINK_INPUT_ANY, str(path).encode())
                if rc:
                    break
            if not rc:
                rc = self.fn("nvJitLinkComplete")(h)
            return rc, self._log(h, "Error") + self._log(h, "Info")
        finally:
            self.fn("nvJitLinkDestroy")(ctypes.byref(h))

    def _log(self, h, which) -> str:
        n = ctypes.c_size_t()
        self.fn(f"nvJitLinkGet{which}LogSize")(h, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        self.fn(f"nvJitLinkGet{which}Log")(h, buf)
        return buf.value.decode(errors="replace")


def fatbin_kinds(obj: Path) -> list[str]:
    """'sass sm_90', 'ptx sm_120', 'lto-ir sm_90a'... for each image in the fatbins of relocatable object `obj`."""
    out = subprocess.run(["readelf", "-S", "-W", str(obj)], capture_output=True, text=True).stdout
    data = obj.read_bytes()
    kinds = []
    for line in out.splitlines():
        m = re.search(r"\]\s+(\S*fatbin\S*)\s+PROGBITS\s+\S+\s+(\S+)\s+(\S+)", line)
        if not m or "Segment" in m.group(1):
            continue
        off, size = int(m.group(2), 16), int(m.group(3), 16)
        blob, p = data[off:off + size], 0
        while p + 16 <= len(blob):
            magic, _, hsz, fsz = struct.unpack_from("<IHHQ", blob, p)
            if magic != 0xBA55ED50:
                break
            q, end = p + hsz, p + hsz + fsz
            while q < end:
                kind, _, ehsz, psz = struct.unpack_from("<HHIQ", blob, q)
                arch = struct.unpack_from("<I", blob, q + 28)[0]
                kinds.append(f"{ {1: 'ptx', 2: 'sass', 4: 'lto-ir'}.get(kind, f'kind{kind}') } sm_{arch}")
                q += ehsz + psz
            p = end
    return kinds


def probe() -> dict:
    install = discovery.find_nvshmem()
    found = {}
    with tempfile.TemporaryDirectory(prefix="tilescale-rdc-probe-") as d:
        tmp = Path(d)
        (tmp / "k.cu").write_text(KERNEL)

        r = nvcc([*ARCH, "-c", "k.cu", "-o", "whole.o", "-Xptxas", "-v"], tmp)
        found["whole_program"] = ptxas_words(r.stdout + r.stderr)
        r = nvcc([*ARCH, "-rdc=true", "-c", "k.cu", "-o", "rdc.o", "-Xptxas", "-v"], tmp)
        found["rdc_no_call"] = ptxas_words(r.stdout + r.stderr)

        tk = shadow_toolkit(tmp)
        lto = subprocess.run([str(tk / "bin" / "nvcc"), *LTO_ARCH, "-rdc=true", "-c", "k.cu", "-o", "k_lto.o"],
                             cwd=tmp, capture_output=True, text=True, timeout=300)
        if lto.returncode:
            found["nvlink_dlto"] = f"LTO compile failed: {lto.stderr.strip()[-300:]}"
        else:
            r = subprocess.run([str(tk / "bin" / "nvcc"), "-dlink", "-dlto", *ARCH, "k_lto.o", "-o", "dl.o"],
                               cwd=tmp, capture_output=True, text=True, timeout=300)
            text = r.stdout + r.stderr
            m = re.search(r"not supported on \.target '(sm_\w+)'", text)
            found["nvlink_dlto"] = (f"target {m.group(1)}: " + m.group(0)) if m else \
                ("linked, " + ptxas_words(text) if r.returncode == 0 else text.strip()[-300:])

        jl_path = find_library(["nvidia/cu1*/lib/libnvJitLink.so*", "nvidia/nvjitlink/lib/libnvJitLink.so*",
                                "lib64/libnvJitLink.so*", "lib/libnvJitLink.so*"])
        if jl_path is None or lto.returncode:
            found["nvjitlink_lto"] = found["nvjitlink_lto_nvshmem"] = "nvJitLink not found" if jl_path is None \
                else "no LTO IR"
        else:
            jl = NvJitLink(jl_path)
            rc, log = jl.link([tmp / "k_lto.o"], ["-arch=sm_90a", "-lto", "-Xptxas=-v"])
            found["nvjitlink_lto"] = (ptxas_words(log) + ("; for sm_90a" if "for 'sm_90a'" in log else "")) \
                if rc == 0 else f"failed ({rc}): {log.strip()[-300:]}"
            if install.device_library is None:
                found["nvjitlink_lto_nvshmem"] = "no libnvshmem_device.a in this NVSHMEM install"
            else:
                rc, log = jl.link([tmp / "k_lto.o", install.device_library],
                                  ["-arch=sm_90a", "-lto", "-Xptxas=-v"])
                found["nvjitlink_lto_nvshmem"] = ptxas_words(log) if rc == 0 else f"failed ({rc}): {log[-300:]}"
            found["nvjitlink"] = jl_path

        if install.device_library is not None:
            (tmp / "lib").mkdir()
            subprocess.run(["ar", "x", str(install.device_library)], cwd=tmp / "lib", check=True)
            kinds = sorted({k for o in sorted((tmp / "lib").glob("*.o")) for k in fatbin_kinds(o)})
            has_lto = any(k.startswith("lto-ir") for k in kinds)
            found["device_library"] = ("has LTO IR: " if has_lto else "no LTO IR (machine code and PTX): ") + \
                ", ".join(kinds)
        else:
            found["device_library"] = "no libnvshmem_device.a in this NVSHMEM install"

        bitcode = sorted(install.lib_dir.glob("libnvshmem_device*.bc"))
        nvvm_path = find_library(["nvvm/lib64/libnvvm.so*", "lib/libnvvm.so*", "lib64/libnvvm.so*",
                                  "nvidia/cu1*/lib/libnvvm.so*"])
        if not bitcode or nvvm_path is None:
            found["libnvvm_bitcode"] = "no libnvshmem_device*.bc" if not bitcode else "libNVVM not found"
        else:
            found["libnvvm_bitcode"] = libnvvm_compile(nvvm_path, bitcode[0])
            found["libnvvm"] = nvvm_path
    found["nvshmem"] = f"{install.version} ({install.source}, {install.lib_dir})"
    found["nvcc"] = toolchain.nvcc_version()
    return found


def libnvvm_compile(path: str, bitcode: Path) -> str:
    """What libNVVM says when asked to turn `bitcode` into LTO IR for sm_90a (``-gen-lto``)."""
    nvvm = ctypes.CDLL(path)
    prog = ctypes.c_void_p()
    nvvm.nvvmCreateProgram(ctypes.byref(prog))
    try:
        data = bitcode.read_bytes()
        rc = nvvm.nvvmAddModuleToProgram(prog, data, len(data), bitcode.name.encode())
        if rc == 0:
            opts = [b"-arch=compute_90a", b"-gen-lto"]
            rc = nvvm.nvvmCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        n = ctypes.c_size_t()
        nvvm.nvvmGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        nvvm.nvvmGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace").strip()
        return "accepted: LTO IR made" if rc == 0 else f"refused ({rc}): {log[-300:]}"
    finally:
        nvvm.nvvmDestroyProgram(ctypes.byref(prog))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the findings here")
    args = ap.parse_args()
    found = probe()
    for i, (step, expect) in enumerate(EXPECTED.items(), 1):
        got = found.get(step, "?")
        flag = "" if expect in got else f"   <- CHANGED (was: {expect})"
        print(f"{i}. {step:22} {got}{flag}")
    for k in ("nvcc", "nvshmem", "nvjitlink", "libnvvm"):
        print(f"   {k}: {found.get(k, '-')}")
    blocked = all(expect in found.get(step, "") for step, expect in EXPECTED.items())
    print("rdc at full speed with these artefacts: " + ("blocked (NVSHMEM's device library holds no LTO IR, and "
          "libNVVM cannot read its bitcode)" if blocked else "re-examine: a step changed"))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
