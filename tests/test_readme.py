"""The README's quickstart is the code a newcomer copies first: its kernel is the one the quickstart example
runs (so the example's tests cover it), and on GPUs the block itself runs, as written, on 2 ranks."""
import ast
import re
from pathlib import Path

import pytest

from tilescale import testing

REPO = Path(__file__).resolve().parent.parent


def quickstart_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Quickstart\n", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "no python block under ## Quickstart"
    return m.group(1)


def _function(src: str, name: str) -> str:
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.dump(fn, include_attributes=False)


def test_quickstart_kernel_is_the_examples():
    block = quickstart_block()
    example = (REPO / "examples" / "distributed" / "example_quickstart.py").read_text()
    assert _function(block, "ring") == _function(example, "ring"), "README's ring() differs from the example's"
    for line in ("info = tilescale.init_distributed()", "tilescale.finalize()", "tilescale.synchronize()"):
        assert line in block, line


@pytest.mark.multigpu
def test_quickstart_block_runs_as_written(tmp_path):
    testing.skip_unless_ranks(2)
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_block())
    proc = testing.launch(script, 2, timeout=300)
    testing.assert_all_ranks_ok(proc, 2)
