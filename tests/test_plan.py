"""tilescale.plan on CPU: plan ids (determinism across processes, every input changes them, source
changes), the plan cache (layout, concurrent writers, corrupt and mismatched files), registry, selector
precedence and its caching, tuning tables and built-in plans (no GPU: the runtime is faked where needed)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tilescale
import tilescale.plan as P
from tilescale.errors import TileScaleError
from tilescale.plan import builtin, cache, registry, selector, tuning
from tilescale.plan import plan as plan_mod
from tilescale.plan.selector import Request

REPO_ROOT = Path(__file__).resolve().parent.parent

ALGO_SRC = '''
def my_allreduce(tensor, op="sum", blocks=4):
    """An allreduce algorithm (never called here)."""
    return ("my_allreduce", blocks, BODY)
'''

COMPILE_IN_SUBPROCESS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tilescale.plan as P
from algos import my_allreduce
p = P.compile(my_allreduce, name="ar", collective="allreduce", world_size=4, nranks_per_node=4,
              min_msg_size=1024, max_msg_size=1 << 20, tags={"b", "a"}, blocks=8)
print("RESULT " + json.dumps({"id": p.id, "path": str(p.path)}))
"""


@pytest.fixture
def plan_dir(tmp_path, monkeypatch):
    d = tmp_path / "plancache"
    monkeypatch.setenv("TILESCALE_PLAN_DIR", str(d))
    monkeypatch.delenv("TILESCALE_TUNING_FILE", raising=False)
    monkeypatch.delenv("TILESCALE_DIST_PREFER", raising=False)
    registry.clear()
    selector.clear_selector()
    yield d
    registry.clear()
    selector.clear_selector()


def _algo_module(dirpath: Path, body: str = "1") -> Path:
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "algos.py").write_text(ALGO_SRC.replace("BODY", body))
    return dirpath


def _compile_elsewhere(moddir: Path, plan_dir: Path, seed: str, cwd: Path) -> dict:
    env = dict(os.environ, TILESCALE_PLAN_DIR=str(plan_dir), PYTHONHASHSEED=seed,
               PYTHONPATH=str(REPO_ROOT), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", COMPILE_IN_SUBPROCESS, str(moddir)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=env, cwd=str(cwd), timeout=120)
    assert r.returncode == 0, r.stdout
    return json.loads(r.stdout.split("RESULT ", 1)[1])


def _ar(tensor, op="sum", blocks=4):
    return blocks


def _ar2(tensor, op="sum", blocks=4):
    return blocks + 1


BASE = dict(name="ar", collective="allreduce", world_size=4, nranks_per_node=4, min_msg_size=0,
            max_msg_size=1 << 20, tags={"x"}, blocks=8)


# ------------------------------------------------------------------------------------------- ids
def test_id_is_the_same_in_every_process(plan_dir, tmp_path):
    moddir = _algo_module(tmp_path / "mod")
    # three processes: different hash seeds, working directories and plan caches
    ids = {_compile_elsewhere(moddir, tmp_path / f"cache{i}", seed, cwd)["id"]
           for i, (seed, cwd) in enumerate([("0", tmp_path), ("1", REPO_ROOT), ("12345", moddir)])}
    assert len(ids) == 1, ids
    # and in this process
    sys.path.insert(0, str(moddir))
    try:
        import algos

        here = P.compile(algos.my_allreduce, name="ar", collective="allreduce", world_size=4, nranks_per_node=4,
                         min_msg_size=1024, max_msg_size=1 << 20, tags={"a", "b"}, blocks=8)
    finally:
        sys.path.remove(str(moddir))
        sys.modules.pop("algos", None)
    assert {here.id} == ids
    assert len(here.id) == 32 and here.id.isalnum() and here.id == here.id.lower()
    # identical inputs give identical files, byte for byte
    files = {(tmp_path / f"cache{i}" / "plans" / "allreduce" / f"{here.id}.json").read_bytes() for i in range(3)}
    assert files == {here.path.read_bytes()}


@pytest.mark.parametrize("change", [
    {"name": "ar2"}, {"collective": "allgather"}, {"world_size": 8, "nranks_per_node": 8},
    {"world_size": 8, "nranks_per_node": 4}, {"nranks_per_node": 2}, {"min_msg_size": 1},
    {"max_msg_size": (1 << 20) + 1}, {"tags": {"x", "y"}}, {"tags": set()}, {"blocks": 16}, {"threads": 128},
    {"blocks": 8.0}, {"constraints": {"dtypes": ["bfloat16"]}}, {"constraints": {"devices": ["cuda"]}},
    {"constraints": {"needs_runtime": True}},
])
def test_every_input_changes_the_id(plan_dir, change):
    a = P.compile(_ar, **BASE)
    b = P.compile(_ar, **{**BASE, **change})
    assert a.id != b.id, change
    assert P.compile(_ar, **BASE).id == a.id  # and back


def test_version_schema_and_algorithm_change_the_id(plan_dir, monkeypatch):
    a = P.compile(_ar, **BASE)
    assert P.compile(_ar2, **BASE).id != a.id                           # another algorithm (other source)
    monkeypatch.setattr(tilescale, "__version__", "99.0")
    b = P.compile(_ar, **BASE)
    monkeypatch.setattr(plan_mod, "SCHEMA_VERSION", 99)
    c = P.compile(_ar, **BASE)
    assert len({a.id, b.id, c.id}) == 3
    assert json.loads(c.path.read_text())["schema_version"] == 99


def test_equivalent_spellings_give_the_same_id(plan_dir):
    a = P.compile(_ar, **{**BASE, "tags": {"x", "y"}})
    b = P.compile(_ar, **{**BASE, "tags": ["y", "x", "y"], "collective": "all_reduce"})
    assert a.id == b.id and a.collective == b.collective == "allreduce"
    c = P.compile(_ar, **{**BASE, "constraints": {"dtypes": ["float16", "bfloat16"]}})
    d = P.compile(_ar, **{**BASE, "constraints": {"dtypes": ("bfloat16", "float16")}})
    assert c.id == d.id


def test_source_change_gives_a_new_id_across_processes(plan_dir, tmp_path):
    moddir = _algo_module(tmp_path / "mod", body="1")
    first = _compile_elsewhere(moddir, plan_dir, "0", tmp_path)["id"]
    _algo_module(moddir, body="2")           # the algorithm's code changed
    second = _compile_elsewhere(moddir, plan_dir, "0", tmp_path)["id"]
    _algo_module(moddir, body="1")           # changed back
    third = _compile_elsewhere(moddir, plan_dir, "0", tmp_path)["id"]
    assert first != second and third == first
    assert {p.stem for p in (plan_dir / "plans" / "allreduce").glob("*.json")} == {first, second}


def test_source_change_in_this_process(plan_dir, tmp_path):
    import importlib

    moddir = _algo_module(tmp_path / "mod2", body="10")
    sys.path.insert(0, str(moddir))
    try:
        import algos

        a = P.compile(algos.my_allreduce, **BASE)
        (moddir / "algos.py").write_text(ALGO_SRC.replace("BODY", "20") + "\n")
        os.utime(moddir / "algos.py", (time.time() + 5, time.time() + 5))
        importlib.reload(algos)
        b = P.compile(algos.my_allreduce, **BASE)
        assert a.id != b.id and b.kernel(None) == ("my_allreduce", 8, 20)
    finally:
        sys.path.remove(str(moddir))
        sys.modules.pop("algos", None)


def test_code_object_fallback_when_source_is_missing(plan_dir):
    def make(body):
        ns = {}
        exec(f"def algo(tensor, op='sum'):\n    return {body}\n", ns)  # inspect.getsource fails on these
        return ns["algo"]

    a, a_again, b = make("1"), make("1"), make("2")
    ida, ida2, idb = (P.compile(f, **BASE).id for f in (a, a_again, b))
    assert ida == ida2 and ida != idb


def test_partial_bound_arguments_count(plan_dir):
    import functools

    a = P.compile(functools.partial(_ar, blocks=2), **{**BASE, "blocks": 8})
    b = P.compile(functools.partial(_ar, blocks=3), **{**BASE, "blocks": 8})
    assert a.id != b.id


# ------------------------------------------------------------------------------------- the handle
def test_handle_fields_kernel_and_record(plan_dir):
    p = P.compile(_ar, **BASE, constraints={"dtypes": ["bfloat16"]})
    assert isinstance(p, P.Plan)
    assert (p.name, p.collective, p.tags) == ("ar", "allreduce", frozenset({"x"}))
    assert dict(p.constraints) == {"world_size": 4, "nranks_per_node": 4, "min_msg_size": 0,
                                   "max_msg_size": 1 << 20, "dtypes": ("bfloat16",)}
    assert p.kernel("t") == 8 and p("t", blocks=1) == 1       # launch config bound, overridable
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "other"                                        # frozen
    with pytest.raises(TypeError):
        p.constraints["world_size"] = 2
    assert p.path == plan_dir / "plans" / "allreduce" / f"{p.id}.json"
    rec = json.loads(p.path.read_text())
    assert rec == p.record() and rec["id"] == p.id and rec["launch_config"] == {"blocks": 8}
    assert rec["inputs"]["env_fingerprint"]["size_bucket"] == [0, 1 << 20]
    assert plan_mod.hash_id(rec["inputs"]) == p.id


@pytest.mark.parametrize("kw,arg", [
    ({"name": ""}, "name"), ({"collective": "allsum"}, "collective"), ({"world_size": 0}, "world_size"),
    ({"nranks_per_node": 3}, "nranks_per_node"), ({"min_msg_size": -1}, "min_msg_size"),
    ({"min_msg_size": 10, "max_msg_size": 5}, "max_msg_size"), ({"tags": "small"}, "tags"),
    ({"blocks": object()}, "launch_config"), ({"constraints": {"colour": "red"}}, "constraints"),
    ({"world_size": True}, "world_size"),
])
def test_bad_inputs_name_the_argument(plan_dir, kw, arg):
    with pytest.raises(ValueError) as ei:
        P.compile(_ar, **{**BASE, **kw})
    assert str(ei.value).startswith(arg) and "expected" in str(ei.value), str(ei.value)


def test_algo_must_be_callable(plan_dir):
    with pytest.raises(ValueError, match="algo: got 3, expected a callable"):
        P.compile(3, **BASE)


# ------------------------------------------------------------------------------------------ cache
@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "list", "other_id", "edited_range",
                                    "edited_inputs", "old_schema"])
def test_corrupt_or_mismatched_file_is_rebuilt(plan_dir, damage, caplog):
    p = P.compile(_ar, **BASE)
    good = p.path.read_bytes()
    rec = json.loads(good)
    if damage == "garbage":
        p.path.write_bytes(b"\x00\xffnot json")
    elif damage == "truncated":
        p.path.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        p.path.write_bytes(b"")
    elif damage == "list":
        p.path.write_text("[1, 2]")
    elif damage == "other_id":
        rec["id"] = "a" * 32
        p.path.write_text(json.dumps(rec))
    elif damage == "edited_range":        # the id still matches the file name, a field does not
        rec["constraints"]["max_msg_size"] = 1
        p.path.write_text(json.dumps(rec))
    elif damage == "edited_inputs":       # inputs no longer hash to the id
        rec["inputs"]["name"] = "other"
        p.path.write_text(json.dumps(rec))
    elif damage == "old_schema":
        rec["schema_version"] = 0
        p.path.write_text(json.dumps(rec))
    assert cache.why_invalid(p.path, p.record()) is not None
    with caplog.at_level("WARNING", logger="tilescale.plan"):
        q = P.compile(_ar, **BASE)
    assert q.id == p.id and p.path.read_bytes() == good
    assert any("rebuilding" in r.message for r in caplog.records)


def test_valid_file_is_not_rewritten_unless_rebuild(plan_dir):
    p = P.compile(_ar, **BASE)
    ino, mtime = p.path.stat().st_ino, p.path.stat().st_mtime_ns
    P.compile(_ar, **BASE)
    assert (p.path.stat().st_ino, p.path.stat().st_mtime_ns) == (ino, mtime)
    P.compile(_ar, **BASE, rebuild=True)
    assert p.path.stat().st_ino != ino                       # a new file renamed into place
    assert cache.why_invalid(p.path, p.record()) is None


def test_deleted_file_is_rebuilt(plan_dir):
    p = P.compile(_ar, **BASE)
    p.path.unlink()
    P.compile(_ar, **BASE)
    assert cache.why_invalid(p.path, p.record()) is None


def test_unwritable_plan_dir_names_the_setting(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILESCALE_PLAN_DIR", str(blocker))
    with pytest.raises(TileScaleError, match="TILESCALE_PLAN_DIR"):
        P.compile(_ar, **BASE)


def test_plan_dir_defaults_to_the_cache_dir(tmp_path, monkeypatch):
    from tilescale.env import settings

    monkeypatch.delenv("TILESCALE_PLAN_DIR", raising=False)
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(tmp_path / "c"))
    assert settings.plan_dir == tmp_path / "c"
    assert P.compile(_ar, **BASE).path.is_relative_to(tmp_path / "c" / "plans" / "allreduce")


WRITER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tilescale.plan as P
from algos import my_allreduce
ids = set()
for i in range(int(sys.argv[2])):
    p = P.compile(my_allreduce, name="ar", collective="allreduce", world_size=4, nranks_per_node=4,
                  min_msg_size=1024, max_msg_size=1 << 20, tags={"b", "a"}, blocks=8, rebuild=True)
    ids.add(p.id)
print("RESULT " + json.dumps(sorted(ids)))
"""


def test_concurrent_writers_leave_one_valid_file(plan_dir, tmp_path):
    moddir = _algo_module(tmp_path / "mod")
    want = _compile_elsewhere(moddir, plan_dir, "0", tmp_path)
    path = Path(want["path"])
    good = path.read_bytes()
    path.unlink()
    env = dict(os.environ, TILESCALE_PLAN_DIR=str(plan_dir), PYTHONPATH=str(REPO_ROOT))
    # four writers rewriting it 50 times each (more processes only add interpreter start-up on a small machine)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(moddir), "50"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for _ in range(4)]
    seen = 0
    while any(p.poll() is None for p in procs):   # read while they write: never a torn file
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        assert data == good, data[:200]
        seen += 1
    outs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ids = {i for o in outs for i in json.loads(o.split("RESULT ", 1)[1])}
    assert ids == {want["id"]}
    assert path.read_bytes() == good and seen > 0
    leftovers = sorted(x.name for x in path.parent.iterdir() if x.name not in (path.name, path.name + ".lock"))
    assert leftovers == []


# --------------------------------------------------------------------------------------- registry
def _req(nbytes, collective="allreduce", world=4, per_node=4, hints=None, dtype="float32", device="cpu"):
    return Request(collective=collective, msg_bytes=nbytes, world_size=world, nranks_per_node=per_node,
                   hints=hints or {}, dtype=dtype, device=device)


def test_register_and_list(plan_dir):
    small = P.compile(_ar, **{**BASE, "name": "small", "tags": {"small", "nvl"}})
    big = P.compile(_ar, **{**BASE, "name": "big", "tags": {"big", "nvl"}, "min_msg_size": 1 << 20,
                            "max_msg_size": 1 << 30})
    ag = P.compile(_ar, **{**BASE, "name": "ag", "collective": "allgather"})
    for p in (big, small, ag, small):       # registering again keeps the place
        P.register(p)
    assert P.list() == [big, small, ag]
    assert P.list(collective="all_reduce") == [big, small]
    assert P.list(tags={"nvl"}) == [big, small]
    assert P.list(collective="allreduce", tags={"small", "nvl"}) == [small]
    assert P.list(tags={"nope"}) == []
    assert P.get(small.id) is small
    assert P.unregister(small.id) is True and P.unregister(small) is False
    assert P.list() == [big, ag]
    with pytest.raises(TypeError, match="plan: got str"):
        P.register(small.id)
    with pytest.raises(ValueError, match="tags"):
        P.list(tags="nvl")


# ---------------------------------------------------------------------------------------- selector
@pytest.fixture
def plans(plan_dir):
    a = P.compile(_ar, **{**BASE, "name": "A", "max_msg_size": 1000})                   # registered, small
    b = P.compile(_ar, **{**BASE, "name": "B", "min_msg_size": 2000, "max_msg_size": 4000})
    c = P.compile(_ar, **{**BASE, "name": "C"})                                          # compiled only
    w8 = P.compile(_ar, **{**BASE, "name": "W8", "world_size": 8, "nranks_per_node": 8})
    P.register(a)
    P.register(b)
    return a, b, c, w8


def test_precedence_registered_then_nccl(plans):
    a, b, c, _ = plans
    assert selector.choose(_req(500)).plan is a and selector.choose(_req(500)).source == "registered"
    assert selector.choose(_req(1000)).plan is a              # inclusive bounds
    assert selector.choose(_req(3000)).plan is b
    nccl = selector.choose(_req(1500))
    assert nccl.plan is None and nccl.source == "nccl" and "no registered plan matches" in nccl.reason
    assert selector.choose(_req(500, world=8, per_node=8)).plan is None   # world size is a constraint
    assert selector.choose(_req(500, collective="allgather")).plan is None
    P.clear()
    assert selector.choose(_req(500)).reason == "no plan registered"


def test_precedence_selector_over_registered(plans):
    a, b, c, w8 = plans
    seen = []

    def sel(by_coll, req):
        seen.append((sorted(by_coll), [p.name for p in by_coll["allreduce"]], req.msg_bytes))
        return c if req.msg_bytes < 100 else (b.id if req.msg_bytes < 200 else None)

    P.set_selector(sel)
    assert selector.choose(_req(50)) == selector.Choice(c, "selector")          # a compiled, unregistered plan
    assert selector.choose(_req(150)).plan is b                                 # by id, out of b's range
    assert selector.choose(_req(500)).plan is a                                 # None: no opinion
    assert seen[0] == (sorted(P.COLLECTIVES), ["A", "B"], 50)
    P.set_selector(lambda by, req: w8)                                          # cannot serve: NCCL, not wrong
    ch = selector.choose(_req(500))
    assert ch.plan is None and "W8" in ch.reason and "world size 8" in ch.reason
    P.set_selector(lambda by, req: 42)
    with pytest.raises(TypeError, match="selector"):
        selector.choose(_req(500))
    P.set_selector(lambda by, req: "nosuchid")
    with pytest.raises(ValueError, match="nosuchid"):
        selector.choose(_req(500))
    P.clear_selector()
    assert P.get_selector() is None and selector.choose(_req(50)).plan is a
    with pytest.raises(TypeError, match="fn: got"):
        P.set_selector("not callable")


def test_precedence_explicit_over_selector(plans):
    a, b, c, w8 = plans
    P.set_selector(lambda by, req: b)
    assert selector.choose(_req(50), plan=c) == selector.Choice(c, "explicit")
    assert selector.choose(_req(50), plan=c.id).plan is c
    assert selector.choose(_req(10**9), plan=a.id).plan is a                   # explicit ignores the range
    with pytest.raises(ValueError, match="plan: got the plan id 'zzz'"):
        selector.choose(_req(50), plan="zzz")
    with pytest.raises(ValueError, match="plan: got W8 .* world size 8"):
        selector.choose(_req(50), plan=w8)
    with pytest.raises(TypeError, match="plan: got int"):
        selector.choose(_req(50), plan=3)


def test_hints(plans):
    a, b, c, _ = plans
    assert selector.choose(_req(500, hints={"prefer": "nccl"})).plan is None
    assert selector.choose(_req(500, hints={"prefer": "nccl"}), plan=a).plan is a   # explicit still wins
    P.set_selector(lambda by, req: c if req.hints.get("mine") else None)
    assert selector.choose(_req(500, hints={"prefer": "nccl", "mine": 1})).plan is c
    assert selector.choose(_req(500, hints={"prefer": "auto"})).plan is a
    with pytest.raises(ValueError, match=r"hints\['prefer'\]: got 'fast'"):
        selector.choose(_req(500, hints={"prefer": "fast"}))
    # prefer tilescale with CPU tensors: no built-in plan runs on them; a registered plan out of range does
    ch = selector.choose(_req(1500, hints={"prefer": "tilescale"}))
    assert ch.plan is a and ch.source == "registered"
    P.clear()
    ch = selector.choose(_req(1500, hints={"prefer": "tilescale"}))
    assert ch.plan is None and "no built-in plan for cpu tensors" in ch.reason


def test_dtype_and_device_constraints(plan_dir):
    p = P.compile(_ar, **BASE, constraints={"dtypes": ["bfloat16"], "devices": ["cuda"]})
    P.register(p)
    assert selector.choose(_req(10, dtype="bfloat16", device="cuda")).plan is p
    assert selector.choose(_req(10, dtype="float32", device="cuda")).plan is None
    assert selector.choose(_req(10, dtype="bfloat16", device="cpu")).plan is None
    assert "dtypes" in p.mismatch(_req(10, dtype="float32", device="cuda"))


def test_needs_runtime_constraint(plan_dir, monkeypatch):
    from tilescale import runtime

    p = P.compile(_ar, **BASE, constraints={"needs_runtime": True})
    P.register(p)
    assert selector.choose(_req(10)).plan is None
    monkeypatch.setattr(runtime, "is_initialized", lambda: True)
    assert selector.choose(_req(10)).plan is p


def test_resolve_caches_per_request_and_invalidates(plans):
    a, b, c, _ = plans
    calls = []

    def sel(by, req):
        calls.append(req.msg_bytes)
        return None

    P.set_selector(sel)
    for _ in range(3):
        assert selector.resolve(_req(500)).plan is a      # world size 4 but no process group: no gather
        assert selector.resolve(_req(3000)).plan is b
    assert calls == [500, 3000]
    assert selector.resolve(_req(500, dtype="bfloat16")).plan is a and calls[-1] == 500 and len(calls) == 3
    P.register(c)                                           # invalidates
    selector.resolve(_req(500))
    assert len(calls) == 4
    P.set_selector(sel)                                     # so does setting a selector
    selector.resolve(_req(500))
    assert len(calls) == 5
    assert selector.resolve(_req(500), plan=c.id).plan is c   # an explicit plan is part of the key
    with pytest.raises(ValueError):
        selector.resolve(_req(500), plan="nosuch")


# ------------------------------------------------------------------------------ tuning and built-ins
def test_shipped_tuning_tables_are_valid_and_choose_nothing_unmeasured():
    files = sorted(tuning.TUNING_DIR.glob("*.json"))
    assert files, "no tuning table shipped"
    for f in files:
        t = tuning.validate(json.loads(f.read_text()), str(f))
        for coll, entries in t["collectives"].items():
            for algo, _ranges in entries:
                assert algo in builtin.ALGOS and builtin.ALGOS[algo][0] == coll


def test_tuning_gpu_names():
    assert tuning.normalize_gpu("NVIDIA H200") == tuning.normalize_gpu(" h200 ") == "h200"
    assert tuning.normalize_gpu("NVIDIA H100 NVL") != tuning.normalize_gpu("NVIDIA H100")


@pytest.mark.parametrize("table,field", [
    ([], "expected an object"), ({"gpu": "", "world_size": 2, "collectives": {}}, "gpu"),
    ({"gpu": "H200", "world_size": 0, "collectives": {}}, "world_size"),
    ({"gpu": "H200", "world_size": 2, "collectives": []}, "collectives"),
    ({"gpu": "H200", "world_size": 2, "collectives": {"allsum": {"algo": "x", "ranges": []}}}, "allsum"),
    ({"gpu": "H200", "world_size": 2, "collectives": {"allreduce": {"algo": "three_shot", "ranges": []}}},
     "three_shot"),
    ({"gpu": "H200", "world_size": 2, "collectives": {"allreduce": {"algo": "one_shot", "ranges": [[5, 1]]}}},
     "ranges"),
    ({"gpu": "H200", "world_size": 2, "collectives": {"allreduce": [{"ranges": [[0, 1]]}]}}, "[0]"),
])
def test_bad_tuning_table_is_named(table, field):
    with pytest.raises(ValueError) as ei:
        tuning.validate(table, "t.json")
    assert str(ei.value).startswith("t.json") and field in str(ei.value), str(ei.value)


def test_no_matching_table_registers_nothing(plan_dir):
    assert builtin.register_tuned("NVIDIA H200", 8, 8) == [] and P.list() == []
    assert builtin.register_tuned("Some Future GPU", 2, 2) == [] and P.list() == []


def test_tuned_plans_serve_only_their_measured_ranges(plan_dir, tmp_path, monkeypatch):
    from tilescale import runtime

    table = {"gpu": "NVIDIA H200", "world_size": 2, "collectives": {
        "all_reduce": [{"algo": "one_shot", "ranges": [[0, 65536]]},
                       {"algo": "tilescale.allreduce.two_shot", "ranges": [[1 << 24, 1 << 28]]}],
        "allgather": {"algo": "push", "ranges": [[1 << 20, 1 << 30], [1 << 31, 1 << 32]]}}}
    f = tmp_path / "t.json"
    f.write_text(json.dumps(table))
    monkeypatch.setenv("TILESCALE_TUNING_FILE", str(f))
    assert builtin.register_tuned("NVIDIA H200", 4, 4) == []             # other world size
    assert builtin.register_tuned("NVIDIA H200", 2, 1) == []             # two nodes: intra-node kernels only
    plans = builtin.register_tuned("h200", 2, 2)
    assert [p.name for p in plans] == ["tilescale.allreduce.one_shot", "tilescale.allreduce.two_shot",
                                       "tilescale.allgather.push", "tilescale.allgather.push"]
    assert P.list() == plans and all({"tilescale", "builtin", "tuned"} <= p.tags for p in plans)
    monkeypatch.setattr(runtime, "is_initialized", lambda: True)

    def pick(n, coll="allreduce", dtype="bfloat16", device="cuda"):
        p = selector.choose(_req(n, collective=coll, world=2, per_node=2, dtype=dtype, device=device)).plan
        return p and p.name

    assert pick(4096) == "tilescale.allreduce.one_shot"
    assert pick(1 << 20) is None                                          # measured: NCCL wins there
    assert pick(1 << 25) == "tilescale.allreduce.two_shot"
    assert pick(1 << 25, dtype="float64") is None and pick(4096, device="cpu") is None
    assert pick(1 << 20, "allgather") == "tilescale.allgather.push" and pick(3 << 30, "allgather") is not None
    assert pick(1 << 19, "allgather") is None and pick(4096, "broadcast") is None
    monkeypatch.setenv("TILESCALE_TUNING_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="TILESCALE_TUNING_FILE"):
        builtin.register_tuned("h200", 2, 2)


def test_builtin_names():
    assert tuning.full_name("allreduce", "one_shot") == "tilescale.allreduce.one_shot"
    assert tuning.full_name("broadcast", "tilescale.broadcast.pull") == "tilescale.broadcast.pull"
    with pytest.raises(ValueError, match="expected a built-in allgather algorithm: tilescale.allgather.push"):
        tuning.full_name("allgather", "one_shot")
    assert {c for c, _ in builtin.ALGOS.values()} == set(P.COLLECTIVES)


def test_catalog_serves_prefer_tilescale_only(plan_dir, monkeypatch):
    from tilescale import runtime
    from tilescale.ops.allreduce import ONE_SHOT_MAX_BYTES

    cat = builtin.catalog(2, 2)
    assert sorted(p.name for p in cat) == sorted(n for n in builtin.ALGOS if not n.endswith(".hierarchical"))
    several = builtin.catalog(4, 2)          # several nodes: every algorithm that runs across nodes, hierarchical too
    assert sorted(p.name for p in several) == sorted(builtin.ALGOS)
    assert {p.name for p in several if p.collective == "allreduce"} == {"tilescale.allreduce.one_shot",
                                                                         "tilescale.allreduce.two_shot"}
    assert builtin.catalog(2, 2, "broadcast") == [p for p in cat if p.collective == "broadcast"]
    for p in cat:
        assert dict(p.constraints)["dtypes"] == ("bfloat16", "float16", "float32")
        assert p.path.is_file() and {"tilescale", "builtin", "default-range"} <= p.tags
    monkeypatch.setattr(runtime, "is_initialized", lambda: True)

    def pick(n, coll="allreduce", prefer="tilescale", dtype="bfloat16"):
        ch = selector.choose(_req(n, collective=coll, world=2, per_node=2, dtype=dtype, device="cuda",
                                  hints={"prefer": prefer}))
        return ch.plan and ch.plan.name

    assert pick(ONE_SHOT_MAX_BYTES) == "tilescale.allreduce.one_shot"
    assert pick(ONE_SHOT_MAX_BYTES + 1) == "tilescale.allreduce.two_shot"
    assert pick(1 << 30, "reduce_scatter") == "tilescale.reduce_scatter.direct"
    assert pick(100, "all_to_all") == "tilescale.all_to_all.push"
    assert pick(100, prefer="auto") is None                             # not registered: NCCL by default
    assert pick(100, dtype="int32") is None
    # explicit ids of built-in plans work without registering them
    two = [p for p in cat if p.name.endswith("two_shot")][0]
    assert selector.choose(_req(8, world=2, per_node=2, dtype="float32", device="cuda"), plan=two.id).plan is two
