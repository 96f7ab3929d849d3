"""The metric names the Sluice processes register, found in the code (for the site's build).

Part of the reference hook (reference.py, which imports it from its own
folder): ``sluice serve``'s table (:class:`pipeline.chain.metrics.Metrics`),
each ``Sample(name=...)`` written in ``pipeline/``, and the node's counters
(``counters["..."]`` keys and the keys of the methods that count for a class,
``self._count("pushed")``), each exposed as ``sluice_node_<key>_total``.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Metric:
    """One metric name: where it comes from, its kind and its help text."""

    process: str
    name: str
    kind: str
    help: str


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _template(node: ast.expr) -> str | None:
    """A string constant, or an f-string with each placeholder shown as ``<name>``."""
    text = _literal(node)
    if text is not None:
        return text
    if not isinstance(node, ast.JoinedStr):
        return None
    parts: list[str] = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            inner = value.value
            label = inner.attr if isinstance(inner, ast.Attribute) else ast.unparse(inner)
            parts.append(f"<{label}>")
    return "".join(parts)


@functools.cache
def parsed_package() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of ``pipeline/``, parsed once per build."""
    return tuple(
        (path, ast.parse(path.read_text(), filename=str(path)))
        for path in sorted((ROOT / "pipeline").rglob("*.py"))
    )


@functools.cache
def package_nodes() -> tuple[ast.AST, ...]:
    """Every node of every module of ``pipeline/``, walked once per build."""
    return tuple(node for _, tree in parsed_package() for node in ast.walk(tree))


def _sample_metrics(nodes: tuple[ast.AST, ...]) -> Iterator[Metric]:
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called != "Sample":
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        name = _template(kw["name"]) if "name" in kw else None
        if name is None or not name.startswith(("sluice_", "<prefix>")):
            continue
        if "<key>" in name or "<group>" in name:
            continue  # health.counter_samples: the node's counters, listed below
        name = name.replace("<prefix>", "sluice_{node,bus}")
        kind = _literal(kw.get("kind")) or "gauge"
        help_ = _literal(kw.get("help")) or ""
        if name.startswith("sluice_bus"):
            process = "bus"
        elif name.startswith("sluice_produce"):
            process = "produce"
        else:
            process = "node, bus"
        yield Metric(process, name, kind, help_)


def _counter_keys(nodes: tuple[ast.AST, ...]) -> Iterator[str]:
    """Keys of ``counters[...]`` and ``_drop(exc, "key", ...)``: the node's counters."""
    for node in nodes:
        if isinstance(node, ast.Subscript):
            target = node.value
            owner = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if owner == "counters":
                key = _template(node.slice)
                if key is not None:
                    yield key
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "_drop"
            and len(node.args) >= 2
        ):
            key = _literal(node.args[1])
            if key is not None:
                yield key


def _counting_methods(tree: ast.Module) -> dict[str, dict[str, tuple[str, str]]]:
    """class -> {method: (template, parameter)} for methods writing ``counters[f"x.{param}"]``."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for method in cls.body:
            if not isinstance(method, ast.FunctionDef):
                continue
            params = {a.arg for a in method.args.args}
            for node in ast.walk(method):
                if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.JoinedStr)):
                    continue
                target = node.value
                if not (isinstance(target, ast.Attribute) and target.attr == "counters"):
                    continue
                names = [
                    v.value.id
                    for v in node.slice.values
                    if isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name)
                ]
                if len(names) == 1 and names[0] in params:
                    template = _template(node.slice) or ""
                    out.setdefault(cls.name, {})[method.name] = (template, f"<{names[0]}>")
    return out


def _counted_keys(trees: list[ast.Module]) -> Iterator[str]:
    """The keys counting methods (``self._count("pushed")``) are called with, resolved
    through each class's bases by name."""
    methods: dict[str, dict[str, tuple[str, str]]] = {}
    bases: dict[str, list[str]] = {}
    for tree in trees:
        methods.update(_counting_methods(tree))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            bases.setdefault(cls.name, [b.id for b in cls.bases if isinstance(b, ast.Name)])

    def lookup(cls: str, method: str) -> tuple[str, str] | None:
        if method in methods.get(cls, {}):
            return methods[cls][method]
        for base in bases.get(cls, []):
            found = lookup(base, method)
            if found is not None:
                return found
        return None

    for tree in trees:
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if not node.args or not isinstance(node.func.value, ast.Name):
                    continue
                found = lookup(cls.name, node.func.attr)
                if found is None:
                    continue
                arg = node.args[0]
                options = [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) else [arg]
                for option in options:
                    value = _literal(option)
                    if value is not None:
                        yield found[0].replace(found[1], value)


def node_metric(key: str) -> str:
    """The metric name of a node counter key (as ``health.counter_samples`` names it)."""
    from pipeline.runtime.health import metric_name

    group, sep, _ = key.partition(":")
    if sep:
        return f"sluice_node_{metric_name(group)}"
    placeholders = re.findall(r"<[^>]*>", key)
    name = metric_name(re.sub(r"<[^>]*>", "PLACEHOLDER", key))
    for placeholder in placeholders:
        name = name.replace("PLACEHOLDER", placeholder, 1)
    return f"sluice_node_{name}_total"


def metrics() -> list[Metric]:
    """Every metric the processes register, found in the code."""
    from pipeline.chain.metrics import Metrics

    found = [
        Metric("serve", name, kind, text)
        for name, (kind, text) in Metrics._HELP.items()  # noqa: SLF001 - the table itself
    ]
    keys: set[str] = set()
    nodes = package_nodes()
    found += _sample_metrics(nodes)
    keys.update(_counter_keys(nodes))
    keys.update(_counted_keys([tree for _, tree in parsed_package()]))
    keys.add("mailbox:<worker>")  # Node.statistics: each worker's mailbox depth
    seen: set[str] = set()
    unique: list[Metric] = []
    for metric in found:
        if metric.name not in seen:
            seen.add(metric.name)
            unique.append(metric)
    for key in sorted(keys):
        name = node_metric(key)
        if name not in seen:
            seen.add(name)
            kind = "gauge" if ":" in key else "counter"
            unique.append(Metric("node", name, kind, f"counter `{key}`"))
    return unique


def metrics_reference() -> str:
    found = metrics()
    lines: list[str] = []
    for process, title in (
        ("serve", "`sluice serve`"),
        ("bus", "`sluice bus`"),
        ("produce", "`sluice produce` (`--health-listen`)"),
        ("node, bus", "`sluice node` and `sluice bus`"),
        ("node", "`sluice node`: its counters"),
    ):
        rows = [m for m in found if m.process == process]
        lines += [f"## {title}", "", "| metric | type | what it counts |", "| --- | --- | --- |"]
        lines += [f"| `{m.name}` | {m.kind} | {m.help.replace('|', '/')} |" for m in rows]
        lines.append("")
    return "\n".join(lines)
