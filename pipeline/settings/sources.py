"""Where settings come from: ``SLUICE_*`` variables and ``sluice.toml``, read as flat names."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.settings.fields import PREFIX

#: ``SLUICE_*`` variables that are not settings: read by scripts, tests, the demo.
NOT_SETTINGS = (
    "CONFIG",
    "BUS_URL",
    "DEMO_ID",
    "CHROMIUM",
    "GO_CACHE",
    "VERSITYGW_CACHE",
    "SECRETS_DIR",
    "POSTGRES_PASSWORD",
    "REDIS_PASSWORD",
    "S3_ACCESS_KEY",
    "S3_SECRET_KEY",
    "SOAK_S",
    "CARDINAL_FEED_S",
)
#: Prefixes (after ``SLUICE_``) of variables that are not settings.
NOT_SETTINGS_PREFIXES = ("TEST_", "BENCH_")

#: Flat name -> (section, field); section "" is the top level.
Index = Mapping[str, tuple[str, str]]


def gather(
    env: Mapping[str, str],
    config_path: str | os.PathLike[str] | None,
    index: Index,
    parts: Collection[str] | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """``(values, sources)`` by flat name: the file's, then the environment's over them.

    ``parts``: only these sections' settings (and the top level's) are kept.
    Unknown names are kept, for building to refuse with their source.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, value, path in _file_values(env, config_path, index):
        values[name] = value
        sources[name] = path
    for var, raw in env.items():
        flat = env_setting(var)
        if flat is not None:
            values[flat] = raw
            sources[flat] = var
    if parts is not None:
        unused = [n for n in values if n in index and index[n][0] and index[n][0] not in parts]
        for name in unused:
            del values[name]
    return values, sources


def env_setting(var: str) -> str | None:
    """The flat setting ``SLUICE_*`` variable ``var`` sets; None when it is not one of ours.

    An unknown ``SLUICE_*`` name is returned as is, so building refuses it the
    way it refuses an unknown key of ``sluice.toml``.
    """
    if not var.startswith(PREFIX):
        return None
    rest = var[len(PREFIX) :]
    if rest in NOT_SETTINGS or rest.startswith(NOT_SETTINGS_PREFIXES) or not rest:
        return None
    return rest.lower()


def _file_values(
    env: Mapping[str, str], config_path: str | os.PathLike[str] | None, index: Index
) -> list[tuple[str, Any, str]]:
    """``(flat name, value, path)`` of the config file's settings.

    A ``config_path`` or the default ``./sluice.toml`` may be absent ("no
    config file"); a file a user named in ``SLUICE_CONFIG`` must exist.
    """
    named = None if config_path else env.get(PREFIX + "CONFIG")
    path = Path(config_path or named or "sluice.toml")
    if not path.exists():
        if named:
            raise ConfigError(f"config file {path} (from {PREFIX}CONFIG) does not exist")
        return []
    return [(name, value, str(path)) for name, value in _read_toml(path, index).items()]


def _read_toml(path: Path, index: Index) -> dict[str, Any]:
    """The ``[sluice]`` table of ``path`` as flat names (``[sluice.bus]`` tables flattened)."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read config file {path}: {reason or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    table = doc.get("sluice", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [sluice] must be a table")
    sections = {section for section, _ in index.values() if section}
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if key in sections and isinstance(value, dict):
            flat.update(_section_table(path, key, value, index))
        else:
            flat[key] = value
    return flat


def _section_table(path: Path, section: str, table: dict[str, Any], index: Index) -> dict[str, Any]:
    """A ``[sluice.<section>]`` table as flat names; an unknown key is refused here."""
    names = {name: flat for flat, (owner, name) in index.items() if owner == section}
    flat: dict[str, Any] = {}
    for name, item in table.items():
        if name not in names:
            raise ConfigError(f"{path}: unknown setting {name!r} in [sluice.{section}]")
        flat[names[name]] = item
    return flat
