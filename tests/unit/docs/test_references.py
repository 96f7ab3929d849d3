"""The references of the documentation site cannot drift from the code.

Generated when the site is built (docs/hooks/reference.py): the CLI (every
command, subcommand and option), the metrics and the Python API; these tests
check that the generator covers what the code has. Written by hand and
checked here: the settings (every setting with its default), the limits
(every constant and parameter they cite exists, and every constant of the
code named as a bound is cited or exempted in ``not_limits.txt`` with its
reason), the JSON-RPC methods, and
every ``SLUICE_*`` variable, metric name and ``sluice`` flag the pages and the
README mention.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.docblocks import DOCS, README, ROOT, SHELL, checked_blocks, pages


@cache
def hook() -> ModuleType:
    """docs/hooks/reference.py, the generator the site's build runs, loaded as MkDocs
    loads it (its folder on sys.path meanwhile, for the module beside it)."""
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    return module


def scan() -> ModuleType:
    """docs/hooks/sluice_docs_metrics.py, which the hook imports: the metric names."""
    hook()
    return sys.modules["sluice_docs_metrics"]


def _text(relative: str) -> str:
    return (ROOT / relative).read_text()


def _all_text() -> str:
    return "\n".join(page.read_text() for page in pages())


# --- the README and the site --------------------------------------------------------------


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_every_page_is_in_the_nav() -> None:
    nav = _text("mkdocs.yml")
    for page in pages():
        if page == README:
            continue
        relative = str(page.relative_to(DOCS))
        assert f" {relative}" in nav, f"{relative} is not in mkdocs.yml's nav"


def test_an_unknown_generated_part_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated part"):
        hook().expand("<!-- generated: nothing -->")
    with pytest.raises(ValueError, match="not a declared facade"):
        hook().expand("<!-- generated: api pipeline.local -->")


# --- settings -----------------------------------------------------------------------------


def shown(value: Any) -> str:
    """A default as the settings page writes it."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif isinstance(value, tuple):
        value = ", ".join(value)
    elif isinstance(value, float):
        value = f"{value:g}"
    return f"`{value}`" if str(value) else "empty"


def code_defaults() -> dict[str, str]:
    """``SLUICE_<NAME>`` -> its default as shown, for every setting."""
    from pipeline.settings import Settings
    from pipeline.settings.build import flat_index, sections

    parts = sections(Settings)
    out: dict[str, str] = {}
    for flat, (section, name) in flat_index(Settings).items():
        cls = parts[section] if section else Settings
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        default: Any = field.default
        if default is dataclasses.MISSING:
            default = field.default_factory()  # type: ignore[operator]
        out[f"SLUICE_{flat.upper()}"] = shown(default)
    return out


def page_defaults() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in _text("docs/reference/settings.md").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`SLUICE_[A-Z0-9_]+`", cells[0]):
            name = cells[0].strip("`")
            assert name not in rows, f"{name} has two rows"
            rows[name] = cells[1]
    return rows


def test_the_settings_page_has_every_setting_with_its_default() -> None:
    code, page = code_defaults(), page_defaults()
    assert sorted(set(code) - set(page)) == [], "settings missing from the settings page"
    assert sorted(set(page) - set(code)) == [], "the settings page lists no such settings"
    wrong = {name: (page[name], code[name]) for name in code if page[name] != code[name]}
    assert wrong == {}, "defaults on the page (page, code)"


def test_the_settings_check_sees_a_changed_default() -> None:
    assert shown(20.0) == "`20`" and shown(("a", "b")) == "`a, b`" and shown("") == "empty"
    assert shown(False) == "`false`" and code_defaults()["SLUICE_SERVE_PORT"] == "`8765`"


def _variables_named() -> set[str]:
    return set(re.findall(r"\bSLUICE_[A-Z0-9_]*[A-Z0-9]\b(?!_\*)", _all_text()))


def test_every_sluice_variable_the_pages_name_exists() -> None:
    from pipeline.settings import NOT_SETTINGS, NOT_SETTINGS_PREFIXES

    settings = set(code_defaults())
    others = {f"SLUICE_{name}" for name in NOT_SETTINGS}
    prefixes = tuple(f"SLUICE_{p}" for p in NOT_SETTINGS_PREFIXES)
    examples = {"SLUICE_NO_SUCH"}  # the settings page's unknown variable, refused
    unknown = sorted(
        name
        for name in _variables_named() - examples
        if name not in settings and name not in others and not name.startswith(prefixes)
    )
    # A family named by its prefix (SLUICE_LAKE_S3_*, SLUICE_BUS_*) is fine when it has members.
    unknown = [n for n in unknown if not any(s.startswith(n + "_") for s in settings)]
    assert unknown == [], "the docs name SLUICE_* variables that are no setting"
    settings_page = _text("docs/reference/settings.md")
    assert all(f"`{name}`" in settings_page for name in others)


# --- limits -------------------------------------------------------------------------------


@cache
def _code_modules() -> dict[str, Path]:
    """Dotted module name -> file, for pipeline/, plugins/ and dags/ (the latter two bare)."""
    out: dict[str, Path] = {}
    for base in ("pipeline", "plugins", "dags"):
        for path in (ROOT / base).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts if base == "pipeline" else parts[1:]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


@cache
def _names(path: Path) -> dict[str, ast.AST | None]:
    """Top-level names a module defines: assignments, defs, classes, and for a package's
    ``__init__`` the names it imports or declares in ``__all__`` (its re-exports, eager or
    lazy). A name another module merely imports is not where it lives: a limit citing it
    there has drifted."""
    found: dict[str, ast.AST | None] = {}
    package = path.name == "__init__.py"
    for node in ast.parse(path.read_text()).body:
        if package and (declared := _all_literal(node)) is not None:
            found.update((name, None) for name in declared)
        if isinstance(node, ast.Assign):
            found.update((t.id, None) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.ImportFrom) and package:
            found.update((a.asname or a.name, None) for a in node.names)
    return found


def _all_literal(node: ast.stmt) -> list[str] | None:
    """The names of ``__all__ = [...]``, or None for any other statement."""
    if not (
        isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]
        and isinstance(node.value, (ast.List, ast.Tuple))
    ):
        return None
    return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]


def _members(node: ast.AST | None) -> set[str]:
    if not isinstance(node, ast.ClassDef):
        return set()
    out: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(item.name)
        elif isinstance(item, ast.Assign):
            out.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out.add(item.target.id)
    return out


def resolve(ref: str) -> list[str]:
    """Where ``module.NAME`` or ``module.Class.member`` is defined: the module given by the
    last dotted names of a module path (``wsconn.MAX_FRAME``, ``redisio.conn.BOUNDS``)."""
    parts = ref.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        suffix, rest = ".".join(parts[:cut]), parts[cut:]
        hits = []
        for module, path in _code_modules().items():
            if module != suffix and not module.endswith("." + suffix):
                continue
            names = _names(path)
            if len(rest) > 2 or rest[0] not in names:
                continue
            if len(rest) == 1 or rest[1] in _members(names[rest[0]]):
                hits.append(f"{module}.{'.'.join(rest)}")
        if hits:
            return hits
    return []


def _parameters(name: str) -> set[str] | None:
    """The parameters of class ``name``'s ``__init__`` (or of function ``name``), if defined once."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = []
    for path in _code_modules().values():
        node = _names(path).get(name)
        if isinstance(node, ast.ClassDef):
            init = [i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == "__init__"]
            found.append(init[0] if init else node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
    if len(found) != 1:
        return None
    fn = found[0]
    if isinstance(fn, ast.ClassDef):  # no __init__ of its own: a dataclass, fields first
        return {
            i.target.id
            for i in fn.body
            if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
        }
    args = fn.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


_DOTTED = re.compile(r"^(?P<ref>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\[(?P<key>[\w.]+)\])?$")
_CALL = re.compile(r"^(?P<name>[A-Z]\w*)\((?P<params>[^)]*)\)$")


def limit_references() -> list[str]:
    refs: list[str] = []
    for line in _text("docs/reference/limits.md").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("process", "---"):
            refs += re.findall(r"`([^`]+)`", cells[3])
    return refs


def check_reference(ref: str) -> str | None:
    """Why ``ref`` (a cell of the limits' last column) does not resolve, or None."""
    if re.fullmatch(r"SLUICE_[A-Z0-9_]+", ref):
        return None if ref in code_defaults() else "no such setting"
    dotted = _DOTTED.match(ref)
    if dotted:
        hits = resolve(dotted["ref"])
        if len(hits) != 1:
            return f"resolves to {hits or 'nothing'}"
        if dotted["key"]:
            module = hits[0].rsplit(".", 1)[0]
            if not resolve(f"{module}.{dotted['key']}"):
                return f"no {dotted['key']} in {module}"
        return None
    call = _CALL.match(ref)
    if call:
        params = _parameters(call["name"])
        if params is None:
            return f"{call['name']} is not one class or function"
        wanted = {p.strip().rstrip("=") for p in call["params"].split(",") if p.strip()}
        return None if wanted <= params else f"no parameter {sorted(wanted - params)}"
    return None  # a flag, a command, a variable of another program: prose


def test_the_limits_cite_constants_that_exist() -> None:
    refs = limit_references()
    assert len(refs) > 100
    broken = {ref: why for ref in refs if (why := check_reference(ref)) is not None}
    assert broken == {}


@pytest.mark.parametrize(
    "ref",
    ["server.MAX_FRAME", "batch.MAX_ITEMS", "SLUICE_NO_SUCH", "Worker(no_such_param)", "x.Y"],
)
def test_a_drifted_limit_reference_is_caught(ref: str) -> None:
    assert check_reference(ref) is not None


def test_the_limits_cite_the_moved_constants_where_they_are() -> None:
    assert check_reference("wsconn.MAX_FRAME") is None
    assert check_reference("blockcodec.MAX_BLOCK_NUM") is None
    assert check_reference("redisio.conn.BOUNDS[Role.TAIL]") is None


# --- limits, the other way: every bound of the code is on the page ------------------------

#: The words of a module-level constant's name that mark it as a bound (``MAX_FRAME``,
#: ``CACHE_MAX``, ``BACKOFF_MAX_S``, ``DEAD_LETTER_MAXLEN``, ``RUN_LIMIT``, ``MIN_FREE_BYTES``,
#: ``redisio.conn.BOUNDS``, ``*_CAP``, ``*_BUDGET``). Durations (``*_S``, ``*_TIMEOUT*``,
#: ``*_TTL*``) and sizes named for what they hold (``READ_BYTES``, ``RETAIN``) are not: most
#: pace work rather than bound it, and those a peer meets are rows already. Each such
#: constant of pipeline/, plugins/ and dags/ is cited in the limits' last column or listed,
#: with its reason, in ``not_limits.txt``.
BOUND_WORDS = frozenset({"MAX", "MAXLEN", "MIN", "LIMIT", "LIMITS", "CAP", "BUDGET", "BOUNDS"})
NOT_LIMITS = Path(__file__).with_name("not_limits.txt")


def bound_names(source: str) -> list[str]:
    """The module-level constants ``source`` assigns whose names mark them as bounds."""
    names: list[str] = []
    for node in ast.parse(source).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        names += [
            t.id
            for t in flat
            if isinstance(t, ast.Name)
            and re.fullmatch(r"_*[A-Z][A-Z0-9_]*", t.id)
            and BOUND_WORDS & set(t.id.strip("_").split("_"))
        ]
    return names


@cache
def _bounds_in(path: Path) -> tuple[str, ...]:
    return tuple(bound_names(path.read_text()))


def bound_constants(replaced: Mapping[str, str] | None = None) -> set[str]:
    """``module.NAME`` of every bound constant of the code; ``replaced`` gives some modules'
    text instead of their file's (a planted constant)."""
    out: set[str] = set()
    for module, path in _code_modules().items():
        text = (replaced or {}).get(module)
        names = bound_names(text) if text is not None else _bounds_in(path)
        out.update(f"{module}.{name}" for name in names)
    return out


def cited_constants() -> set[str]:
    """``module.NAME`` of every bound constant the limits page cites, in the module assigning
    it: a name cited through a package that re-exports it (``blockcodec.MAX_ITEMS``) counts
    for the module under that package assigning it."""
    modules = _code_modules()
    out: set[str] = set()
    for ref in limit_references():
        dotted = _DOTTED.match(ref)
        for hit in resolve(dotted["ref"]) if dotted else []:
            module, _, name = hit.rpartition(".")
            if module not in modules:
                continue  # a class member (``Class.NAME``): not a module-level constant
            if name in _bounds_in(modules[module]):
                out.add(hit)
                continue
            out.update(
                f"{under}.{name}"
                for under, path in modules.items()
                if under.startswith(module + ".") and name in _bounds_in(path)
            )
    return out


def exemptions(text: str | None = None) -> dict[str, str]:
    """``not_limits.txt`` (or ``text``): ``module.NAME: reason`` a line, ``#`` comments."""
    text = NOT_LIMITS.read_text() if text is None else text
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(": ")
        if not re.fullmatch(r"[\w.]+\.\w+", name) or not reason.strip():
            raise ValueError(f"{NOT_LIMITS.name}:{number}: not `module.NAME: reason`: {line!r}")
        if name in out:
            raise ValueError(f"{NOT_LIMITS.name}:{number}: {name} is listed twice")
        out[name] = reason.strip()
    return out


UNCITED = "bound constants neither cited on docs/reference/limits.md nor in not_limits.txt"
STALE = "exempted in not_limits.txt, but no such bound constant in the code"
BOTH = "cited on docs/reference/limits.md and exempted in not_limits.txt"


def limit_coverage(
    bounds: set[str], cited: set[str], exempt: Mapping[str, str]
) -> dict[str, list[str]]:
    """What keeps the code's bounds and the limits page apart, by kind (empty lists: none)."""
    return {
        UNCITED: sorted(bounds - cited - set(exempt)),
        STALE: sorted(set(exempt) - bounds),
        BOTH: sorted(cited & set(exempt)),
    }


def test_every_bound_in_the_code_is_on_the_limits_page_or_exempted() -> None:
    bounds, cited, exempt = bound_constants(), cited_constants(), exemptions()
    assert len(bounds) > 80 and len(cited) > 60 and len(exempt) > 10
    assert limit_coverage(bounds, cited, exempt) == {UNCITED: [], STALE: [], BOTH: []}


def test_a_bound_cited_through_its_package_counts_where_it_is_assigned() -> None:
    cited = cited_constants()
    assert "pipeline.blockcodec.block.MAX_ITEMS" in cited  # cited as `blockcodec.MAX_ITEMS`
    assert "pipeline.redisio.conn.BOUNDS" in cited  # `redisio.conn.BOUNDS[Role.TAIL]`
    assert "pipeline.chain.serve.wsconn.MAX_FRAME" in cited


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("pipeline.chain.serve.wsconn", "MAX_PLANTED = 1"),
        ("pipeline.chain.serve.wsconn", "PLANTED_MAX_S: float = 2.0"),
        ("pipeline.chain.serve.wsconn", "_PLANTED_LIMIT = 3"),
        ("pipeline.bus.peers", "PLANTED_CAP = 4"),
        ("pipeline.bus.peers", "PLANTED_BUDGET, OTHER = 5, 6"),
        ("pipeline.lake.replay", "MIN_PLANTED_BYTES = 7"),
        ("pipeline.lake.replay", "PLANTED_MAXLEN = 8"),
        ("sluice_archive", "MAX_PLANTED = 9"),  # a DAG
        ("sluice_lake_job", "MAX_PLANTED = 10"),  # a plugin
    ],
)
def test_an_uncited_new_bound_is_caught(module: str, line: str) -> None:
    planted = _code_modules()[module].read_text() + f"\n{line}\n"
    name = re.split(r"[:,= ]", line)[0]
    cited, exempt = cited_constants(), exemptions()
    before = limit_coverage(bound_constants(), cited, exempt)[UNCITED]
    after = limit_coverage(bound_constants({module: planted}), cited, exempt)[UNCITED]
    assert sorted(set(after) - set(before)) == [f"{module}.{name}"]


@pytest.mark.parametrize(
    "line",
    [
        "SCAN_COUNT = 1000",  # a hint, not a bound
        "MAXIMUM_PLANTED = 1",  # MAXIMUM is not the word MAX
        "CAPTION = 'x'",
        "max_planted = 2",  # not a constant
        "def MAX_PLANTED() -> int: return 3",
    ],
)
def test_a_name_that_is_no_bound_is_left_alone(line: str) -> None:
    assert bound_names(line) == []


def test_a_stale_or_doubled_exemption_is_caught() -> None:
    exempt = dict(exemptions())
    exempt["pipeline.bus.peers.MAX_GONE"] = "a constant since renamed"
    exempt["pipeline.chain.serve.wsconn.MAX_FRAME"] = "cited on the page as well"
    problems = limit_coverage(bound_constants(), cited_constants(), exempt)
    assert problems[STALE] == ["pipeline.bus.peers.MAX_GONE"]
    assert problems[BOTH] == ["pipeline.chain.serve.wsconn.MAX_FRAME"]


@pytest.mark.parametrize(
    "text",
    [
        "pipeline.bus.peers.MAX_DOWN\n",  # no reason
        "pipeline.bus.peers.MAX_DOWN:\n",
        "MAX_DOWN: no module\n",
        "pipeline.bus.peers.MAX_DOWN: one\npipeline.bus.peers.MAX_DOWN: two\n",
    ],
)
def test_a_malformed_exemption_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not_limits.txt:\d+: "):
        exemptions(text)


# --- metrics ------------------------------------------------------------------------------


@cache
def _metric_patterns() -> list[re.Pattern[str]]:
    out = []
    for metric in scan().metrics():
        name = re.escape(metric.name)
        name = re.sub(r"<[^>]*>", r"[a-z0-9_]+", name.replace(r"\<", "<").replace(r"\>", ">"))
        name = name.replace(r"\{node,bus\}", "(node|bus)")
        out.append(re.compile(name + "$"))
    return out


def test_the_generated_metrics_cover_every_metric_name_in_the_code() -> None:
    patterns = _metric_patterns()
    in_code: set[str] = set()
    for node in scan().package_nodes():
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and re.fullmatch(r"sluice_(serve|bus|node)_[a-z0-9_]+", text):
            in_code.add(text)
    assert len(in_code) > 30
    missing = sorted(n for n in in_code if not any(p.match(n) for p in patterns))
    assert missing == []


def test_every_metric_the_pages_name_exists() -> None:
    patterns = _metric_patterns()
    named = set(re.findall(r"\bsluice_(?:serve|bus|node)_[a-z0-9_]*[a-z0-9]\b", _all_text()))
    assert len(named) > 10
    unknown = sorted(n for n in named if not any(p.match(n) for p in patterns))
    # A family named by a prefix in prose (`sluice_serve_catchup_shared_{hits,...}`).
    unknown = [n for n in unknown if not any(p.pattern.startswith(n) for p in patterns)]
    assert unknown == []


def test_the_node_counters_are_named_as_the_health_server_names_them() -> None:
    from pipeline.runtime.health import counter_samples, metric_name

    for key in ("stream_service.pushed", "mailbox:echo"):
        [sample] = counter_samples("sluice_node", {key: 1})
        assert scan().node_metric(key.replace("echo", "<worker>")) == metric_name(sample.name)


# --- the CLI ------------------------------------------------------------------------------


@cache
def commands() -> dict[tuple[str, ...], Any]:
    return {command.argv: command for command in hook().commands()}


def test_the_cli_reference_has_every_command_and_subcommand() -> None:
    from pipeline.bus.cli import SUBCOMMANDS
    from pipeline.cli import COMMANDS
    from pipeline.lake.jobargs import parser

    expected: set[tuple[str, ...]] = {(name,) for name in COMMANDS}
    [jobs] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    expected |= {("lake", job) for job in jobs.choices}
    expected |= {("bus", sub) for sub in re.findall(r"sluice bus (\w+)", SUBCOMMANDS)}
    assert expected <= set(commands())
    for argv, command in commands().items():
        assert command.help.startswith(f"usage: sluice {' '.join(argv)}"), argv


def test_the_cli_reference_shows_every_option() -> None:
    for argv, command in commands().items():
        parsers = [p for p in command.parsers if p.prog == f"sluice {' '.join(argv)}"]
        assert parsers, argv
        for action in parsers[0]._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for option in action.option_strings:
                assert option in command.help, f"sluice {' '.join(argv)} {option}"


def _options(argv: tuple[str, ...]) -> set[str]:
    parsers = [p for p in commands()[argv].parsers if p.prog == f"sluice {' '.join(argv)}"]
    return {o for a in parsers[0]._actions for o in a.option_strings}


def test_every_sluice_command_in_the_pages_uses_real_options() -> None:
    """``sluice CMD [SUB] --flag`` in every shell block: the command and its flags exist."""
    checked = 0
    for block in checked_blocks():
        if block.lang not in SHELL:
            continue
        script = block.code.replace("\\\n", " ")
        for match in re.finditer(
            r"(?:^|[\s;&|(])(?:\.venv/bin/)?sluice((?: [a-z][a-z-]*)+)", script
        ):
            words = tuple(match[1].split())
            argv = words[:2] if words[:2] in commands() else words[:1]
            assert argv in commands(), f"{block.id}: sluice {' '.join(words)}"
            line = script[match.end() :].split("\n")[0].split("#")[0]
            line = re.split(r"[|;&>]", line)[0]
            flags = set(re.findall(r"(?:^|\s)(--[a-z][a-z-]*)", line))
            unknown = flags - _options(argv) - {"--help"}
            assert not unknown, f"{block.id}: sluice {' '.join(argv)} has no {sorted(unknown)}"
            checked += 1
    assert checked > 20


# --- the Python API and JSON-RPC ----------------------------------------------------------


def test_the_api_pages_cover_every_facade_and_name() -> None:
    from tests.unit.api.test_declared import FACADES

    assert tuple(hook().FACADES) == FACADES
    for facade in FACADES:
        module = importlib.import_module(facade)
        targets = dict(hook().api_targets(facade))
        assert set(module.__all__) - set(targets) <= {"__version__"}, facade
        for name, target in targets.items():
            where, _, qualname = target.rpartition(".")
            assert getattr(importlib.import_module(where), qualname) is getattr(module, name)
        page = DOCS / "reference/api" / f"{facade.rpartition('.')[2] or 'pipeline'}.md"
        assert f"<!-- generated: api {facade} -->" in page.read_text(), page


def test_the_jsonrpc_page_names_every_method() -> None:
    from pipeline.chain.serve import wsconn

    page = _text("docs/reference/jsonrpc.md")
    methods = set(wsconn._METHODS)
    assert methods and {m for m in methods if f"`{m}`" not in page} == set()
