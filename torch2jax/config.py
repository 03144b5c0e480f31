"""``[tool.torch2jax]`` in the user's ``pyproject.toml``, and user rule directories.

The table is found by walking up from the converted path to the first ``pyproject.toml`` that
has one (a ``pyproject.toml`` without the table does not stop the walk: a sub-project's file
may leave the configuration to the repository's)::

    [tool.torch2jax]
    target = "nnx"                 # what --target defaults to
    exclude = ["legacy/", "*_old.py"]   # gitignore patterns, relative to this pyproject.toml
    rules = ["tools/torch2jax_rules"]   # folders of extra rule files (*.toml), relative to it
    ignore = ["torch.distributed.*"]    # rule ids whose diagnostics (and TODOs) are dropped
    shard = "data"                      # what --shard defaults to (data or params)

Every error names the file and the key (or the rule file and the rule) at fault.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from torch2jax.ruleset import RuleError, RuleSet, load_rules, parse_rule_text

KEYS = {"target": str, "exclude": list, "rules": list, "ignore": list, "shard": str}


class ConfigError(ValueError):
    """The configuration or a user rule file is invalid; the message says where."""


@dataclass(frozen=True)
class Config:
    path: Path | None = None  # the pyproject.toml it came from
    target: str | None = None
    shard: str | None = None
    exclude: tuple[str, ...] = ()
    rules: tuple[Path, ...] = ()
    ignore: tuple[str, ...] = ()

    @property
    def base(self) -> Path:
        return self.path.parent if self.path is not None else Path.cwd()


def find_config(start: Path) -> Config:
    """The ``[tool.torch2jax]`` table of the nearest ``pyproject.toml`` above ``start``."""
    start = Path(start).resolve()
    folder = start if start.is_dir() else start.parent
    for d in (folder, *folder.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            cfg = load_config(candidate)
            if cfg is not None:
                return cfg
    return Config()


def load_config(pyproject: Path) -> Config | None:
    """The table of one ``pyproject.toml``; None when it has none."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{pyproject}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{pyproject}: not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("torch2jax")
    if table is None:
        return None
    where = f"{pyproject}: [tool.torch2jax]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown} (known: {', '.join(KEYS)})")
    for key, kind in KEYS.items():
        if key in table and not isinstance(table[key], kind):
            raise ConfigError(f"{where}: {key} must be a {'string' if kind is str else 'list'}")
        if kind is list and any(not isinstance(v, str) for v in table.get(key, [])):
            raise ConfigError(f"{where}: {key} must be a list of strings")
    base = pyproject.parent
    rules = tuple((base / r).resolve() for r in table.get("rules", []))
    for r in rules:
        if not r.is_dir():
            raise ConfigError(f"{where}: rules: {r} is not a folder")
    if table.get("shard", "data") not in ("data", "params"):
        raise ConfigError(f"{where}: shard must be \"data\" or \"params\"")
    return Config(path=pyproject.resolve(), target=table.get("target"), shard=table.get("shard"),
                  exclude=tuple(table.get("exclude", [])), rules=rules,
                  ignore=tuple(table.get("ignore", [])))


_DOTTED = re.compile(r"^\.?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def load_user_rules(dirs: tuple[Path, ...] | list[Path]) -> RuleSet:
    """The built-in rules extended (or overridden) by the ``*.toml`` files of ``dirs``, each
    user rule checked: a clear :class:`ConfigError` names the file and the rule."""
    from torch2jax.passes.specials import SPECIALS

    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise ConfigError(f"{d}: rule folder not found")
        files = sorted(d.glob("*.toml"))
        if not files:
            raise ConfigError(f"{d}: rule folder holds no *.toml file")
        for f in files:
            try:
                rs = parse_rule_text(f.read_text(encoding="utf-8"), str(f))
            except RuleError as exc:
                raise ConfigError(str(exc)) from None
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{f}: cannot be read: {exc}") from None
            for rule in rs.all():
                where = f"{f}: [[{rule.kind}]] {rule.torch!r}"
                if rule.special and rule.special not in SPECIALS:
                    raise ConfigError(f"{where}: special {rule.special!r} is not a registered "
                                      f"transform (known: {', '.join(sorted(SPECIALS))})")
                if rule.target_layers:
                    # targets/layer_table.py reads the built-in rules' tables only
                    raise ConfigError(f"{where}: linen / equinox tables are read from the "
                                      "built-in rules only (rules/*.toml of the package), "
                                      "not from a user's rule folder")
                if rule.kind != "method" and not rule.torch.startswith("torch"):
                    raise ConfigError(f"{where}: 'torch' must be a qualified torch name "
                                      "(torch.nn.X, torch.nn.functional.f, torch.f)")
                for target, ctor in [("jax", rule.jax or ""), *rule.targets.items()]:
                    if ctor and not rule.special and not _DOTTED.match(ctor):
                        raise ConfigError(f"{where}: {target} = {ctor!r} is not a dotted "
                                          "name (use special for anything else)")
    try:
        return load_rules(tuple(str(d) for d in dirs))
    except RuleError as exc:
        raise ConfigError(str(exc)) from None
