"""Cost model of AllGather, AG+GEMM and GEMM+RS on 1-64 nodes of 8 H200 (one 400 Gb/s NIC per GPU).

    python docs/multinode_model.py            # print the markdown that docs/multinode.md embeds
    python docs/multinode_model.py --write    # rewrite that part of docs/multinode.md in place

Pure Python, standard library only; part of the package because the plan selector applies its ``rule``
(tilescale/plan/multinode.py); docs/multinode_model.py runs it.
docs/multinode.md explains the model, where each parameter comes
from (measured here, published, or assumed) and what the numbers mean; tests/test_multinode_model.py checks
that the document holds exactly what this script prints.

Every variant of a collective is described by two numbers, its latency part L (phase latencies and
per-destination costs, s) and its bandwidth part W (bytes over the slowest link, s, with pipelining across
its phases). A standalone call takes T0 + L + W. A fused op overlaps W and L with its GEMM (see `fused`).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
NODES = (1, 2, 4, 8, 16, 32, 64)
AG_SIZES = (64 * KIB, 1 * MIB, 16 * MIB, 256 * MIB, 1 * GIB)   # gathered output per rank (the selector's msg_bytes)
AG_GEMM_SHAPES = ((4096, 8192, 2048), (4096, 8192, 7168), (8192, 8192, 2048), (8192, 8192, 7168),
                  (16384, 8192, 2048), (16384, 8192, 7168), (8192, 4096, 2752))   # issue 18, M x K x N
GEMM_RS_SHAPES = ((8192, 8192, 8192), (16384, 8192, 8192), (8192, 28672, 8192))
BYTES = 2   # bf16

FLAT_DIRECT, FLAT_RING = "flat direct", "flat ring"
INTER_INTRA, INTRA_INTER = "hier inter→intra", "hier intra→inter"
VARIANTS = (FLAT_DIRECT, FLAT_RING, INTER_INTRA, INTRA_INTER)

BEGIN, END = "<!-- multinode_model.py: begin -->", "<!-- multinode_model.py: end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "multinode.md"   # in a source tree


@dataclass(frozen=True)
class Params:
    """The model's inputs. docs/multinode.md, "Parameters", gives each one's source."""

    g: int = 8                  # GPUs (ranks) per node, one NIC each, rail-optimised
    b_nvl: float = 348e9        # B/s per GPU per direction over NVLink (measured: AllGather busbw, 2 x H200)
    t0: float = 3.0e-6          # launch and host cost of one call (measured: 6.3 us one-shot minus a_nvl)
    a_nvl: float = 3.3e-6       # one NVLink phase: signal and wait (measured: two-shot minus one-shot, 1 KiB)
    b_net: float = 43e9         # B/s per GPU per direction over its NIC (published: DeepEP, NVSHMEM, CX7 400G)
    a_net: float = 8.35e-6      # one inter-node put-with-signal (published: GIN GDAKI round trip 16.7 us / 2)
    o_dest: float = 0.05e-6     # per remote destination per GPU: WQE, QP context (assumption)
    flops: float = 750e12       # bf16 GEMM, FLOP/s (measured: cuBLAS 722-780 TFLOP/s on these shapes)
    eff_ag: float = 1.00        # tilescale's AG+GEMM GEMM / cuBLAS (measured 1.00-1.02)
    eff_rs: float = 0.87        # tilescale's GEMM+RS GEMM / cuBLAS (measured 0.76-0.98)
    overlap_cost: float = 0.03  # slowdown of the GEMM while it overlaps communication (measured ~3%)


P0 = Params()


@dataclass(frozen=True)
class Comm:
    lat: float   # latency part L, s
    bw: float    # bandwidth part W, s


def _forward(first: float, second: float, chunks: int) -> float:
    """Two phases pipelined over `chunks` equal pieces, one of which (this rank's or this node's own) needs
    no first phase: the second phase alone, or all of the first plus the second phase's last piece."""
    return max(second, first + second / chunks)


def comm(op: str, variant: str, n: int, s: float, p: Params = P0) -> Comm | None:
    """Variant `variant` of AllGather (`op` "ag": every rank contributes a shard of s bytes) or
    ReduceScatter (`op` "rs": every rank ends with a reduced block of s bytes) on n nodes of p.g GPUs.
    None where the variant does not exist (hierarchical variants on one node)."""
    g = p.g
    P = n * g
    if variant == FLAT_DIRECT:                       # one put to every peer, NVLink and NIC at once
        remote = P - g
        net = remote * (s / p.b_net + p.o_dest)
        return Comm(p.a_net if n > 1 else p.a_nvl, max(net, (g - 1) * s / p.b_nvl))
    if variant == FLAT_RING:                         # P-1 steps, g rings (one per NIC), a chunk crosses every hop
        net_hops = n if n > 1 else 0
        lat = net_hops * p.a_net + (P - 1 - net_hops) * p.a_nvl
        into = (P - 1) * s                           # bytes every rank receives
        via_nic = into / g if n > 1 else 0.0         # the rings that enter the node at this rank
        return Comm(lat, max(via_nic / p.b_net, (into - via_nic) / p.b_nvl))
    if n == 1:
        return None
    # The good order sends each shard over the network once, along its rail, and spreads it over NVLink
    # (AllGather: inter then intra; ReduceScatter: reduce intra first, then inter). The other order sends
    # whole node blocks (g shards) along the rails.
    good = INTER_INTRA if op == "ag" else INTRA_INTER
    lat = p.a_net + p.a_nvl
    if variant == good:
        net = (n - 1) * (s / p.b_net + p.o_dest)
        nvl = (g - 1) * n * s / p.b_nvl
        return Comm(lat, _forward(net, nvl, n))
    if variant in (INTER_INTRA, INTRA_INTER):
        net = (n - 1) * (g * s / p.b_net + p.o_dest)
        nvl = (g - 1) * s / p.b_nvl
        return Comm(lat, _forward(nvl, net, g))
    raise ValueError(f"variant: got {variant!r}, expected one of {VARIANTS}")


def collective_time(op: str, variant: str, n: int, s: float, p: Params = P0) -> float | None:
    c = comm(op, variant, n, s, p)
    return None if c is None else p.t0 + c.lat + c.bw


@dataclass(frozen=True)
class Fused:
    time: float      # whole op, s
    gemm: float      # its GEMM alone (with the overlap slowdown), s
    comm: float      # its communication alone (L + W), s
    t0: float        # its launch cost, s

    @property
    def exposed(self) -> float:
        """Time the op takes beyond launch + GEMM: communication not hidden."""
        return max(0.0, self.time - self.gemm - self.t0)

    @property
    def hidden(self) -> float:
        """Fraction of the communication hidden under the GEMM."""
        return 1.0 - self.exposed / self.comm if self.comm > 0 else 1.0


def shard_bytes(op: str, shape: tuple[int, int, int], n: int, p: Params = P0) -> float:
    """Bytes each rank contributes (AG+GEMM: its rows of A) or receives (GEMM+RS: its rows of the output)."""
    M, K, N = shape
    return BYTES * M * (K if op == "ag_gemm" else N) / (n * p.g)


def fused(op: str, variant: str, shape: tuple[int, int, int], n: int, p: Params = P0) -> Fused | None:
    """AG+GEMM (`op` "ag_gemm": C = all_gather(A) @ B, the per-rank GEMM is M x K x N with M gathered) or
    GEMM+RS (`op` "gemm_rs": reduce_scatter(X @ W), the per-rank GEMM is M x K x N, output M/P x N).
    AG+GEMM starts on its own rows and takes each shard as it lands, so it ends with the GEMM or with the
    last shard plus that shard's GEMM. GEMM+RS computes the blocks in the order their owners need them, its
    own last (tilescale/ops/gemm_rs.py), and each moves once computed: it ends with the GEMM, with the last
    sent block (computed second to last) plus its transfer, or with the first block plus all transfers."""
    M, K, N = shape
    P = n * p.g
    eff = p.eff_ag if op == "ag_gemm" else p.eff_rs
    gemm = 2.0 * M * K * N / p.flops / eff * (1 + p.overlap_cost)
    c = comm("ag" if op == "ag_gemm" else "rs", variant, n, shard_bytes(op, shape, n, p), p)
    if c is None:
        return None
    if op == "ag_gemm":
        t = max(gemm, c.lat + c.bw + gemm / P)
    else:
        t = max(gemm, gemm * (P - 1) / P + c.lat + c.bw / (P - 1), gemm / P + c.lat + c.bw)
    return Fused(p.t0 + t, gemm, c.lat + c.bw, p.t0)


def best(times: dict, load: dict | None = None) -> str:
    """The variant with the smallest time (None entries skipped). Ties (a fused op whose communication is
    hidden by every variant) go to the smallest `load` (communication time: the most margin, the least
    traffic competing with anything else), then to the earlier variant."""
    load = load or {}
    return min((v for v in VARIANTS if times.get(v) is not None), key=lambda v: (times[v], load.get(v, 0.0)))


# ------------------------------------------------------------------ the rule the plan selector should apply
def flat_threshold(n: int, g: int = P0.g, p: Params = P0) -> float:
    """Shard bytes (per rank) at or below which the flat direct variant beats the hierarchical one on n nodes
    of g ranks: there the hierarchical variant's extra NVLink phase (a_nvl) costs more than the (n-1)(g-1)
    extra network messages of the flat one save. 0 when hierarchical always wins."""
    if n <= 1 or g <= 1:
        return float("inf")
    m = (n - 1) * (g - 1)
    num = p.a_nvl - m * p.o_dest
    den = m / p.b_net - (g - 1) / p.b_nvl
    return max(0.0, num / den) if num > 0 else 0.0


def rule(collective: str, msg_bytes: int, world_size: int, nranks_per_node: int, p: Params = P0) -> str:
    """The variant the selector should pick, from what a plan request carries (tilescale/plan/selector.py's
    Request: msg_bytes is the gathered output for all_gather, the whole input for reduce_scatter).
    all_gather and ag_gemm use the AllGather variants, reduce_scatter and gemm_rs the ReduceScatter ones."""
    n = world_size // nranks_per_node
    if n == 1 or nranks_per_node == 1:
        return FLAT_DIRECT                       # one node (today's kernels), or nothing to be hierarchical about
    if msg_bytes / world_size <= flat_threshold(n, nranks_per_node, p):
        return FLAT_DIRECT
    return INTER_INTRA if collective in ("all_gather", "ag_gemm") else INTRA_INTER


# ------------------------------------------------------------------ markdown
def fmt_bytes(b: float) -> str:
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if b >= div:
            v = b / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{b:.0f} B"


def fmt_us(t: float | None) -> str:
    if t is None:
        return "-"
    us = t * 1e6
    return f"{us:.1f}" if us < 100 else f"{us:,.0f}"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _head(cells) -> list[str]:
    return [_row(cells), _row(["---"] * len(cells))]


def allgather_table(p: Params = P0) -> list[str]:
    out = _head(["nodes", "gathered / rank", "shard", *VARIANTS, "pick", "busbw of pick (GB/s)"])
    for n in NODES:
        for size in AG_SIZES:
            s = size / (n * p.g)
            t = {v: collective_time("ag", v, n, s, p) for v in VARIANTS}
            pick = best(t)
            busbw = size * (n * p.g - 1) / (n * p.g) / t[pick] / 1e9
            out.append(_row([n, fmt_bytes(size), fmt_bytes(s), *(fmt_us(t[v]) for v in VARIANTS),
                             pick, f"{busbw:.0f}"]))
    return out


def fused_table(op: str, shapes, p: Params = P0) -> list[str]:
    out = _head(["nodes", "M x K x N", "GEMM", *VARIANTS, "pick", "exposed", "hidden"])
    for n in NODES:
        for shape in shapes:
            f = {v: fused(op, v, shape, n, p) for v in VARIANTS}
            pick = best({v: (x.time if x else None) for v, x in f.items()}, {v: x.comm for v, x in f.items() if x})
            out.append(_row([n, "x".join(map(str, shape)), fmt_us(f[pick].gemm),
                             *(fmt_us(f[v].time if f[v] else None) for v in VARIANTS), pick,
                             fmt_us(f[pick].exposed), f"{100 * f[pick].hidden:.0f}%"]))
    return out


def hide_threshold(op: str, n: int, variant: str, M: int = 8192, other: int = 8192, p: Params = P0) -> int | None:
    """Smallest N (AG+GEMM, K = other) or K (GEMM+RS, N = other), a multiple of 128, at which at most 2% of
    the op's time is exposed communication; None if not below 65536."""
    for x in range(128, 65537, 128):
        shape = (M, other, x) if op == "ag_gemm" else (M, x, other)
        f = fused(op, variant, shape, n, p)
        if f is not None and f.exposed <= 0.02 * f.time:
            return x
    return None


def crossovers(p: Params = P0) -> list[str]:
    out = _head(["nodes", "flat direct beats hierarchical below (shard / rank)", "= gathered / rank",
                 "AG+GEMM hides from N = (hier / flat direct)", "GEMM+RS hides from K = (hier / flat direct)"])
    for n in NODES[1:]:
        thr = flat_threshold(n, p.g, p)
        gathered = thr * n * p.g
        ag = [hide_threshold("ag_gemm", n, v, p=p) for v in (INTER_INTRA, FLAT_DIRECT)]
        rs = [hide_threshold("gemm_rs", n, v, p=p) for v in (INTRA_INTER, FLAT_DIRECT)]
        out.append(_row([n, fmt_bytes(thr) if thr else "never", fmt_bytes(gathered) if thr else "-",
                         " / ".join(f"{x:,}" if x else "> 65,536" for x in ag),
                         " / ".join(f"{x:,}" if x else "> 65,536" for x in rs)]))
    return out


# Measured on 2 x H200 (bench_allgather.py, bench_fused.py, profile_ag_gemm.py; 2026-11-22): what the model
# says for the same calls.
CALIBRATION = (
    ("AllGather, 1 MiB from each rank (no handshake)", 8.9e-6,
     lambda p: collective_time("ag", FLAT_DIRECT, 1, MIB, p)),
    ("AllGather, 32 MiB from each rank", 104e-6,
     lambda p: collective_time("ag", FLAT_DIRECT, 1, 32 * MIB, p)),
    ("AllGather, 256 MiB from each rank", 772e-6,
     lambda p: collective_time("ag", FLAT_DIRECT, 1, 256 * MIB, p)),
    ("AG+GEMM 8192x8192x2048 (whole op)", 430e-6,
     lambda p: fused("ag_gemm", FLAT_DIRECT, (8192, 8192, 2048), 1, p).time),
    ("GEMM+RS 8192x8192x8192, K/2 per rank", 1076e-6,
     lambda p: fused("gemm_rs", FLAT_DIRECT, (8192, 4096, 8192), 1, p).time),
)


def calibration(p: Params = P0) -> list[str]:
    two = Params(**{**p.__dict__, "g": 2})
    out = _head(["call (2 x H200)", "measured (us)", "model (us)", "model / measured"])
    for name, measured, f in CALIBRATION:
        m = f(two)
        out.append(_row([name, fmt_us(measured), fmt_us(m), f"{m / measured:.2f}"]))
    return out


def report(p: Params = P0) -> str:
    parts = [
        "Generated by `python docs/multinode_model.py` (edit the script, then run it with `--write`). "
        "Times in microseconds, bf16, slowest rank; `-`: the variant does not exist on one node.",
        "", "#### Calibration against runs on 2 x H200 (the same formulas with 2 GPUs per node)", "", *calibration(p),
        "", "#### AllGather", "", *allgather_table(p),
        "", "#### AG+GEMM (per-rank GEMM M x K x N, A gathered by rows)", "",
        *fused_table("ag_gemm", AG_GEMM_SHAPES, p),
        "", "#### GEMM+RS (per-rank GEMM M x K x N, output M/P x N per rank)", "",
        *fused_table("gemm_rs", GEMM_RS_SHAPES, p),
        "", "#### Crossovers (M = 8192 and the other dimension 8192 for the hiding thresholds)", "", *crossovers(p),
    ]
    return "\n".join(parts) + "\n"


def embed(doc_text: str, generated: str) -> str:
    """`doc_text` with the part between the BEGIN and END markers replaced by `generated`."""
    rx = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not rx.search(doc_text):
        raise ValueError(f"markers {BEGIN!r} ... {END!r} not found")
    return rx.sub(lambda _: f"{BEGIN}\n{generated}{END}", doc_text)


def embedded(doc_text: str) -> str:
    """The part of `doc_text` between the markers."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), doc_text, re.S)
    if m is None:
        raise ValueError(f"markers {BEGIN!r} ... {END!r} not found")
    return m.group(1)


def main(argv: list[str]) -> int:
    text = report()
    if argv[1:] == ["--write"]:
        DOC.write_text(embed(DOC.read_text(), text))
        print(f"wrote {DOC}")
    elif argv[1:]:
        print("usage:\n" + "\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
        return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
