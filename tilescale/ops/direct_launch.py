"""The direct launch path of tilescale's ops: a compiled kernel's C entry point ``call`` called through
ctypes with raw pointers and ints (one ctypes call instead of tilelang's generic per-argument handling,
which costs microseconds per launch), when its signature is the expected one."""
import ctypes
import re

_C_TYPES = {"uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64, "int": ctypes.c_int, "int32_t": ctypes.c_int32}


def call_signature(host_source: str) -> list[tuple[str, str]] | None:
    """(C type, name) of each parameter of the host entry point ``call`` in a tilelang host wrapper, or
    None when there is no such function."""
    m = re.search(r"\bint\s+call\s*\(([^)]*)\)", host_source)
    if m is None:
        return None
    params = []
    for p in m.group(1).split(","):
        p = p.split("=")[0].replace("__restrict__", " ").strip()
        if not p:
            continue
        typ, _, name = p.rpartition(" ") if "*" not in p else p.rpartition("*")
        params.append(((typ.strip() + ("*" if "*" in p else "")).strip(), name.strip()))
    return params


def argtypes_for(signature, names) -> list | None:
    """ctypes argument types for `signature` (from :func:`call_signature`) if its parameters are exactly
    `names` followed by the stream, and each type is a pointer or a known integer; else None."""
    if signature is None or [n for _, n in signature] != [*names, "stream"]:
        return None
    out = []
    for typ, _ in signature:
        if typ.endswith("*") or typ == "cudaStream_t":
            out.append(ctypes.c_void_p)
        elif typ in _C_TYPES:
            out.append(_C_TYPES[typ])
        else:
            return None
    return out


def direct_entry(kernel, names):
    """The C entry point of a compiled kernel's library, callable with raw pointers and ints (one ctypes
    call instead of tilelang's generic per-argument handling, which costs microseconds per launch), when
    its signature is `names` + stream; else None (the caller then launches through ``kernel.launch``)."""
    try:
        src = kernel.kernel.get_host_source()
        lib = kernel.library
    except Exception:  # noqa: BLE001
        return None
    types = argtypes_for(call_signature(src or ""), names)
    if types is None or not isinstance(lib, ctypes.CDLL):
        return None
    fn = lib["call"]  # a new function object: tilelang's own `lib.call` keeps its settings
    fn.argtypes, fn.restype = types, ctypes.c_int
    err = lib["get_last_error"]
    err.argtypes, err.restype = [], ctypes.c_char_p
    return fn, err
