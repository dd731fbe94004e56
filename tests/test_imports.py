"""No import circles in tilescale: the graph of which module imports which (read from the sources: every
``import`` and ``from ... import``, at module level or inside a function, and the modules reached by name
through ``importlib.import_module("tilescale....")`` or ``sys.modules[...]``) has no cycle, but for the
ones listed in EXPECTED, which are known and being removed (a cycle that is gone must leave the list too).

Discovery by name is not an edge: ``tilescale.ops.registry`` imports every module of its package by
listing the directory (the op modules register themselves there), so no module names it."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tilescale"

# Cycles known and due to go, each a set of modules: none left (add none: move the code that causes it).
EXPECTED: list[set[str]] = []

def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(name: str, known) -> str | None:
    """The tilescale module `name` is, or is in (``a.b.c`` where only ``a.b`` is a module: ``a.b``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(path: Path, me: str, known) -> set[str]:
    """The tilescale modules that module `me` (at `path`) imports."""
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func    # importlib.import_module("tilescale.x") / sys.modules.get("tilescale.x")
            if (isinstance(f, ast.Attribute) and f.attr in ("import_module", "get")
                    and isinstance(node.args[0].value, str)):
                names = [node.args[0].value]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value,
                                                                                                    str):
            names = [node.slice.value] if ast.unparse(node.value) == "sys.modules" else []
        for n in names:
            if n.startswith("tilescale"):
                target = _resolve(n, known)
                if target is not None and target != me:
                    out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(p, m, mods) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_right():
    g = graph()
    assert "tilescale.ops.registry" in g["tilescale.ops.allreduce"]            # from . import registry
    assert "tilescale.ops.reduce_scatter" in g["tilescale.ops.allreduce"]      # from .reduce_scatter import ...
    assert "tilescale.plan.plan" in g["tilescale.plan.registry"]              # from .plan import Plan
    assert "tilescale.runtime" in g["tilescale.ops.op_cache"]                 # from .. import runtime
    assert "tilescale.plan.cache" in g["tilescale.plan.plan"]                # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_modules_reached_by_name_are_edges(tmp_path):
    """A module named in importlib.import_module(...) / sys.modules.get(...) / sys.modules[...] is an edge."""
    known = {"tilescale.x", "tilescale.y", "tilescale.z", "tilescale.w"}
    src = tmp_path / "m.py"
    src.write_text("import importlib, sys\n"
                   "def f():\n"
                   "    importlib.import_module('tilescale.x')\n"
                   "    sys.modules.get('tilescale.y')\n"
                   "    return sys.modules['tilescale.z.inner']\n")
    assert imports(src, "tilescale.m", known) == {"tilescale.x", "tilescale.y", "tilescale.z"}


def test_no_import_cycles():
    found = cycles(graph())
    new = [sorted(c) for c in found if not any(c <= e for e in EXPECTED)]
    assert not new, f"import cycles: {new}"
    gone = [sorted(e) for e in EXPECTED if not any(c <= e for c in found)]
    assert not gone, f"these cycles are gone: remove them from EXPECTED in {__file__}: {gone}"


# The packages in layers, bottom first: a module imports modules of its own layer or below only. (tilescale.ops
# loads tilescale.pytorch's torch_ops for its lazy names by name, which is not an import.)
LAYERS = (
    ("tilescale.env", "tilescale.errors", "tilescale.arguments", "tilescale.compat", "tilescale.build_modes",
     "tilescale.logs", "tilescale.version"),
    ("tilescale.compilation",),
    ("tilescale.language",),
    ("tilescale.runtime",),
    ("tilescale.compiler",),
    ("tilescale.ops", "tilescale.plan", "tilescale.profiler"),
    ("tilescale.pytorch",),
)


def layer(module: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {w}" for m, ws in g.items() for w in ws
                  if layer(m) is not None and layer(w) is not None and layer(w) > layer(m))


def test_the_packages_import_only_downward():
    """The compile side imports nothing of the runtime, the runtime nothing of the ops, nothing below imports the
    torch integration."""
    assert not upward_imports(graph()), upward_imports(graph())


def test_an_upward_import_is_found():
    g = {"tilescale.runtime.symm": {"tilescale.ops.checks"}, "tilescale.ops.checks": {"tilescale.errors"}}
    assert upward_imports(g) == ["tilescale.runtime.symm -> tilescale.ops.checks"]
