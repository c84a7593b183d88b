"""The package's layout: no import circles between imgcopy's modules, as a
reader following every import sees them (lazy, function-level imports and
``if TYPE_CHECKING:`` ones count), and every command module of the command
line has the same shape."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE = Path(__file__).resolve().parent.parent / "imgcopy"


def _imports(tree: ast.AST, module: str, names: Set[str]) -> Set[str]:
    """The package's modules ``module`` imports, anywhere: at the top, in
    functions, under ``if TYPE_CHECKING:`` (a type checker follows those,
    and so does a reader)."""
    out: Set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom):
            base: Optional[str]
            if node.level:
                base = node.module or ""
            elif node.module and (node.module == "imgcopy" or node.module.startswith("imgcopy.")):
                base = node.module[len("imgcopy"):].lstrip(".")
            else:
                base = None
            if base is not None:
                if base:
                    out.add(base.split(".")[0])
                for alias in node.names:  # from . import cli_check
                    if alias.name in names:
                        out.add(alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("imgcopy."):
                    out.add(alias.name.split(".")[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    out.discard(module)
    return out & names


def _graph() -> Dict[str, Set[str]]:
    files = {p.stem: p for p in PACKAGE.glob("*.py")}
    names = set(files)
    return {name: _imports(ast.parse(path.read_text(), str(path)), name, names)
            for name, path in files.items()}


def _cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    state: Dict[str, int] = {}
    stack: List[str] = []

    def walk(node: str) -> Optional[List[str]]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = walk(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = walk(node)
            if found:
                return found
    return None


def test_the_graph_is_read():
    graph = _graph()
    # an oracle for the parser itself: edges known to exist, lazy ones included
    assert "options" in graph["convert"]
    assert "cli" in graph["_program"]  # function-level
    assert "cli_check" in graph["cli"]  # from . import cli_check
    assert "_core" not in graph["image"]  # a stub (.pyi), no module of ours
    assert graph["_drawables"] == set()  # the views' protocols: a leaf


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_type_checking_and_lazy_imports_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from .info import ImageInfo\nelse:\n    from .plan import X\n"
                     "def f():\n    from .extents import Y\n"
                     "if typing.TYPE_CHECKING:\n    import imgcopy.job\n")
    assert _imports(tree, "m", {"info", "plan", "extents", "job"}) == \
        {"info", "plan", "extents", "job"}


def test_no_import_circles():
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_views_do_not_import_what_they_draw():
    """Not even for their annotations: they take it through _drawables'
    protocols."""
    graph = _graph()
    for view in ("_html", "_plot"):
        assert not graph[view] & {"extents", "info", "plan", "image", "convert"}, view
        assert "_drawables" in graph[view], view


def test_every_command_module_has_register_and_run():
    """Every cli_*.py but the helpers they share (cli_common.py) is a command,
    run by cli.py through register(subparsers) and run(args) alone."""
    from imgcopy import cli
    commands = sorted(p for p in PACKAGE.glob("cli_*.py") if p.stem != "cli_common")
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in cli.COMMANDS) == \
        [p.stem for p in commands]
    for path in commands:
        tree = ast.parse(path.read_text(), str(path))
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for name in ("register", "run"):
            assert name in defs, f"{path.name} defines no {name}()"
        assert [a.arg for a in defs["register"].args.args] == ["subparsers"], path.name
        assert [a.arg for a in defs["run"].args.args] == ["args"], path.name
