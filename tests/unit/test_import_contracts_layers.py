"""The layers hold: which room may import which, no import cycle, pure code stays pure when called.

Imports are followed at any depth of a module's code (inside functions too:
they run later, but they run), except under ``if TYPE_CHECKING:`` (never at
run time) and ``if __name__ == "__main__":`` (an entry point is the top of
the stack, not a layer). Relative imports are resolved; a string that names a
module (``importlib.import_module("pipeline....")``, a facade's export map, the
dispatcher's command table, Spark's daemon module) counts as an import of it.
``dags/`` and ``plugins/`` are rooms too, above the package (Airflow puts both
folders on ``sys.path``, so ``import sluice_dag_common`` names a plugin).
Package ``__init__`` facades import lazily (PEP 562) and are left out of the
cycle check: importing ``pipeline.bus.server`` runs ``pipeline.bus``'s
``__init__`` whatever the code says.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipeline"

#: What each part may import besides the rooms ranked below the parts (``GROUND``).
ALLOWED: dict[str, set[str]] = {
    "routing": set(),
    "dialogue": {"routing"},
    "streams": {"routing", "dialogue"},
    "bus": set(),
    "lake": set(),
    "chain": {"dialogue", "lake"},
}
#: The rooms of ``pipeline`` from the bottom: a module may import a module of its own
#: room or of a room ranked below it; the parts (rank ``PARTS``) import each other only as
#: ``ALLOWED`` says. Ground modules of one rank import none of each other.
GROUND: dict[str, int] = {
    "errors": 0,
    "intervals": 1,
    "keys": 1,
    "facade": 1,
    "lifecycle": 1,
    "loggate": 1,
    "blockcodec": 1,
    "airflowfolders": 1,
    "cliargs": 1,
    "redisio": 2,
    "settings": 3,
    "runtime": 3,
    "local": 6,
    "board": 6,
    "demo": 7,
    "cli": 8,
    "plugins": 9,
    "dags": 10,
}
PARTS = 5
#: Rooms inside a part, from the bottom ("" is the part's own top-level modules).
SUBROOMS: dict[str, dict[str, int]] = {
    "chain": {"": 0, "produce": 1, "client": 1, "history": 2, "serve": 3},
    "lake": {"storage": 0, "intake": 0, "spark": 1, "write": 2, "": 3},
}
#: Base modules that start other parts' commands by name (importlib), never by import.
DISPATCHER = "pipeline.cli"
#: What of the lake the chain part may reach: its JVM-free storage room.
CHAIN_READS_LAKE = "pipeline.lake.storage"


#: The folders whose modules are rooms, and how a module there is named.
FOLDERS = ("pipeline", "dags", "plugins")


def _modules(root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder in FOLDERS:
        for path in (root / folder).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _skipped(node: ast.If) -> bool:
    test = ast.unparse(node.test)
    return test in ("TYPE_CHECKING", "typing.TYPE_CHECKING", "__name__ == '__main__'")


def _absolute(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative levels resolved against ``name``."""
    if node.level == 0:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``path`` imports at run time, at any depth, by statement or by name."""
    found: set[str] = set()
    bare = {m.split(".", 1)[1]: m for m in modules if m.startswith(("dags.", "plugins."))}
    started: set[int] = set()  # ``python -m MODULE``: another process's entry point, not an import

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("getLogger"):
            return  # a logger's name, not a module loaded
        if isinstance(node, ast.Tuple | ast.List | ast.Call):
            items = node.args if isinstance(node, ast.Call) else node.elts
            for before, item in zip(items, items[1:], strict=False):
                if isinstance(before, ast.Constant) and before.value == "-m":
                    started.add(id(item))
        if id(node) in started:
            return
        if isinstance(node, ast.If) and _skipped(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(bare.get(alias.name, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(name, path, node)
            module = bare.get(module, module)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)  # a module named by a string: kept only if it is one
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules}


def _graph(root: Path) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: _imports(name, path, modules) - {name} for name, path in modules.items()}


MODULES = _modules(ROOT)
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}
GRAPH = _graph(ROOT)


def _room(name: str) -> str:
    """The room a module belongs to: a part, a ground room, a top-level module's name, dags, plugins."""
    parts = name.split(".")
    if parts[0] != "pipeline":
        return parts[0]
    return parts[1] if len(parts) > 1 else "pipeline"


def _part(name: str) -> str | None:
    """The part a module belongs to; None for the ground, local servers, demo and cli."""
    room = _room(name)
    return room if room in ALLOWED else None


def _rank(room: str) -> int:
    return PARTS if room in ALLOWED else GROUND[room]


def _subroom(name: str) -> str:
    """The room inside its part: ``serve`` for ``pipeline.chain.serve.server``, else ""."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and ".".join(parts[:3]) in PACKAGES else ""


def test_every_room_has_a_rank() -> None:
    rooms = {_room(n) for n in MODULES} - {"pipeline"}
    assert sorted(r for r in rooms if r not in ALLOWED and r not in GROUND) == []
    for part, ranks in SUBROOMS.items():
        seen = {_subroom(n) for n in MODULES if _room(n) == part and n != f"pipeline.{part}"}
        assert sorted(seen - set(ranks)) == [], part


def _climbs(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a room ranked at or above the importer's (parts: unless ``ALLOWED``)."""
    return sorted(
        f"{name} imports {dep}"
        for name, deps in graph.items()
        if name != "pipeline"  # the root facade names parts lazily
        for dep in deps
        if (src := _room(name)) != (dst := _room(dep))
        and dst != "pipeline"
        and not (_rank(dst) < _rank(src))
        and not (src in ALLOWED and dst in ALLOWED[src])
    )


def _climbs_inside_parts(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a room of the same part ranked at or above the importer's room."""
    return sorted(
        f"{name} imports {dep}"
        for name, deps in graph.items()
        if (part := _room(name)) in SUBROOMS and name != f"pipeline.{part}"
        for dep in deps
        if _room(dep) == part
        and dep != f"pipeline.{part}"
        and (src := _subroom(name)) != (dst := _subroom(dep))
        and not SUBROOMS[part][dst] < SUBROOMS[part][src]
    )


def test_each_room_imports_only_the_rooms_below_it() -> None:
    assert _climbs(GRAPH) == []


def test_each_part_imports_only_the_parts_below_it() -> None:
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        for dep in deps
        if (src := _part(name)) is not None
        and (dst := _part(dep)) is not None
        and dst != src
        and dst not in ALLOWED[src]
    )
    assert wrong == []


def test_the_rooms_inside_a_part_import_downward() -> None:
    assert _climbs_inside_parts(GRAPH) == []


#: Climbs planted in a copy of the tree, each in a form the statement-only check missed.
PLANTED = {
    # a relative climb from the lake's storage up to its writers
    "pipeline/lake/storage/store.py": "from ..write import jobs  # noqa\n",
    # a plugin importing a DAG (Airflow's folders are on sys.path)
    "plugins/sluice_redis_hook.py": "import sluice_archive  # noqa\n",
    # a part naming the demo by string, as importlib would load it
    "pipeline/bus/dead.py": "_PLANTED = 'pipeline.demo.app'\n",
    # a facade's export map pointing up into another part
    "pipeline/lake/__init__.py": "_PLANTED = {'X': 'pipeline.chain.serve.server'}\n",
    # a ground module importing a part inside a function
    "pipeline/keys.py": "def _planted() -> None:\n    from pipeline.bus import envelope  # noqa\n",
}


def test_planted_climbs_are_caught(tmp_path: Path) -> None:
    for folder in FOLDERS:
        shutil.copytree(
            ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    for rel, line in PLANTED.items():
        with (tmp_path / rel).open("a") as out:
            out.write("\n" + line)
    climbs = _climbs(_graph(tmp_path)) + _climbs_inside_parts(_graph(tmp_path))
    assert set(climbs) >= {
        "pipeline.lake.storage.store imports pipeline.lake.write.jobs",
        "plugins.sluice_redis_hook imports dags.sluice_archive",
        "pipeline.bus.dead imports pipeline.demo.app",
        "pipeline.lake imports pipeline.chain.serve.server",
        "pipeline.keys imports pipeline.bus.envelope",
    }
    assert _climbs(GRAPH) == [] and _climbs_inside_parts(GRAPH) == []


def test_the_chain_reads_the_lake_only_through_its_storage() -> None:
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        if _room(name) == "chain"
        for dep in deps
        if _room(dep) == "lake" and not dep.startswith(CHAIN_READS_LAKE)
    )
    assert wrong == []


def test_no_part_imports_the_local_servers_or_the_demo() -> None:
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        if _part(name) is not None
        for dep in deps
        if _room(dep) in ("local", "demo")
    )
    assert wrong == []


def test_base_modules_import_no_part() -> None:
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        if name != "pipeline" and _rank(_room(name)) < PARTS  # the root facade names parts lazily
        for dep in deps
        if _part(dep) is not None
    )
    assert wrong == []


def test_no_part_imports_the_cli_dispatcher() -> None:
    assert sorted(name for name, deps in GRAPH.items() if DISPATCHER in deps) == []


def test_no_import_cycle_between_modules() -> None:
    graph = {n: {d for d in deps if d not in PACKAGES} for n, deps in GRAPH.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                walk(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert cycles == []


def test_the_lake_never_imports_the_chain_part() -> None:
    # the block codec is at the bottom (pipeline/blockcodec.py) for this
    assert not [n for n, deps in GRAPH.items() if _part(n) == "lake" and any(
        _part(d) == "chain" for d in deps)]  # fmt: skip


#: Pure modules, a call of each, and what must not be loaded after it.
CALLS = {
    "pipeline.blockcodec": (
        "m.decode_block(m.encode_block(m.Block(num=1, hash=b'h'*32, parent=b'p'*32)))",
        ("asyncio", "redis", "aiohttp", "pyarrow"),
    ),
    "pipeline.intervals": ("m.covered_until([(0, 5), (5, 9)], 3)", ("asyncio", "pyarrow")),
    "pipeline.chain.serve.coverage": (
        "m.summarize([])",
        ("asyncio", "redis", "aiohttp", "pyarrow"),
    ),
}


@pytest.mark.parametrize("module", sorted(CALLS))
def test_pure_functions_load_nothing_when_called(module: str) -> None:
    call, banned = CALLS[module]
    code = (
        f"import sys, importlib\nm = importlib.import_module({module!r})\n{call}\n"
        f"print(','.join(n for n in {banned!r} if n in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"{module} loaded {out.stdout.strip()} when called"
