"""Settings from config files and ``--set key=value``, and the run record that replays a run.

A config file is flat: its keys are the settings' field names (``TrainSettings``), its values
those fields' values. YAML (``.yaml``/``.yml``), TOML (``.toml``) and JSON (``.json``) read
alike. A value is converted by its field's type, the same way from a file and from ``--set``:

- ``int``/``float``: a number, or text that parses as one (YAML reads ``5e-5`` as text);
- ``bool``: true/false (also yes/no, on/off, 1/0 as text);
- a ``Path``: text; an enum or a ``Literal``: one of its values;
- ``tuple[X, ...]``: a list, or text with the items separated by commas (``optimizer`` or
  ``generator,optimizer``; an empty text is the empty tuple);
- ``dict[str, X]``: a mapping, or text of ``key:value`` pairs separated by commas;
- a field that may be None: ``null`` in YAML/JSON, or the text ``none``/``null`` (TOML has no
  null; leaving the key out gives the field's default).

An unknown key, or a value of the wrong type, is a ``ConfigError`` whose one-line message names
the key, what was expected and, for an unknown key, the nearest valid one.

The run record (``run_config.json``) holds every field of the settings plus the keys in
``RECORD_KEYS``; read back as a config file it rebuilds the same settings. The module works on
any keyword dataclass of such fields; ``multiminddev.train.pipeline.TrainSettings`` is the one
the commands use.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
import tomllib
import types
import typing
import uuid
from pathlib import Path
from typing import Any

# Keys a run record holds beside the settings: what they are is for people, so reading the
# record back skips them.
RECORD_KEYS = ("resume_command", "replay_command")
RUN_CONFIG_FILE = "run_config.json"  # the run record, in the run's output folder
CONFIG_SUFFIXES = (".yaml", ".yml", ".toml", ".json")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("none", "null")


class ConfigError(ValueError):
    """A config file or ``--set`` value that cannot be used; the message is one line."""


# --------------------------------------------------------------------------- field types

def field_types(settings_cls: type) -> dict[str, Any]:
    """Each init field of the dataclass and its resolved type annotation."""
    hints = typing.get_type_hints(settings_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(settings_cls) if f.init}


def unknown_key_message(key: str, valid: typing.Iterable[str], where: str,
                        what: str = "setting") -> str:
    """``where: unknown setting 'KEY'; did you mean 'NEAREST'?`` (else the valid names)."""
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = (f"did you mean {close[0]!r}?" if close
            else f"the {what}s are: {', '.join(valid)}")
    return f"{where}: unknown {what} {key!r}; {hint}"


def convert(name: str, hint: Any, value: Any) -> Any:
    """``value`` (from a file, or text from ``--set``) as a value of type ``hint``; a
    ``ConfigError`` naming the setting when it is not one."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        is_none = value is None or (isinstance(value, str) and value.strip().lower() in _NONE)
        if is_none and len(inner) < len(args):
            return None
        if len(inner) != 1:
            raise ConfigError(f"{name}: its type {hint} cannot be read from a config file")
        return convert(name, inner[0], value)
    if value is None:
        raise ConfigError(f"{name}: expected {_describe(hint)}, got null (it cannot be None)")
    if origin is typing.Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and value.strip() == str(choice)):
                return choice
        raise ConfigError(f"{name}: expected {_describe(hint)}, got {value!r}")
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise ConfigError(f"{name}: its type {hint} cannot be read from a config file")
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list of {_describe(args[0])}, got {value!r}")
        return tuple(convert(name, args[0], item) for item in value)
    if origin is dict:
        if len(args) != 2 or args[0] is not str:
            raise ConfigError(f"{name}: its type {hint} cannot be read from a config file")
        if isinstance(value, str):
            pairs = [item.partition(":") for item in value.split(",") if item.strip()]
            if any(not sep for _, sep, _ in pairs):
                raise ConfigError(f"{name}: expected key:value pairs separated by commas, "
                                  f"got {value!r}")
            value = {k.strip(): v.strip() for k, _, v in pairs}
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return {str(k): convert(f"{name}.{k}", args[1], v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in hint)
            raise ConfigError(f"{name}: expected one of {choices}, got {value!r}") from None
    if hint is bool:
        return _to_bool(name, value)
    if hint is int:
        return _to_number(name, int, "an integer", value)
    if hint is float:
        return float(_to_number(name, float, "a number", value))
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name}: expected text, got {value!r}")
    if hint is Path:
        if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
            return Path(value)
        raise ConfigError(f"{name}: expected a path, got {value!r}")
    raise ConfigError(f"{name}: its type {hint} cannot be read from a config file")


def _to_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _to_number(name: str, kind: type, what: str, value: Any) -> int | float:
    if isinstance(value, bool):  # True is an int to Python, never a count
        raise ConfigError(f"{name}: expected {what}, got {value!r}")
    if kind is int and isinstance(value, int):
        return value
    if kind is float and isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            pass
    raise ConfigError(f"{name}: expected {what}, got {value!r}")


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in hint)
    return {bool: "true or false", int: "an integer", float: "a number", str: "text",
            Path: "a path"}.get(hint, str(hint))


# --------------------------------------------------------------------------- sources

def settings_values(settings_cls: type, data: typing.Mapping[str, Any], *,
                    where: str) -> dict[str, Any]:
    """``data``'s settings, each converted by its field's type; an unknown key is an error
    naming the nearest valid one. ``where`` names the source in messages."""
    types_ = field_types(settings_cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in types_:
            raise ConfigError(unknown_key_message(str(key), types_, where))
        try:
            out[key] = convert(key, types_[key], value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return out


def parse_set_options(settings_cls: type, items: typing.Iterable[str]) -> dict[str, Any]:
    """``--set key=value`` options as settings; a later option for the same key wins."""
    data: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: give key=value, e.g. --set num_steps=12")
        data[key.strip()] = text.strip()
    return settings_values(settings_cls, data, where="--set")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfigFile:
    """A config file's settings; ``is_run_record`` when it is a run's ``run_config.json``."""

    path: Path
    values: dict[str, Any]
    is_run_record: bool


def read_config_file(settings_cls: type, path: Path) -> ConfigFile:
    """The settings in a YAML, TOML or JSON config file, or a run record (a run folder stands
    for its ``run_config.json``)."""
    path = Path(path)
    if path.is_dir():
        if not (path / RUN_CONFIG_FILE).is_file():
            raise ConfigError(f"--config {path} is a folder without {RUN_CONFIG_FILE}; give a "
                              ".yaml, .toml or .json file, or a run folder")
        path = path / RUN_CONFIG_FILE
    suffix = path.suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ConfigError(f"--config {path}: give a .yaml, .toml or .json file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read it as UTF-8 text ({exc})") from None
    data = _parse(path, suffix, text)
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of setting names to values")
    is_record = any(k in data for k in RECORD_KEYS)
    settings = {k: v for k, v in data.items() if k not in RECORD_KEYS}
    return ConfigFile(path=path, is_run_record=is_record,
                      values=settings_values(settings_cls, settings, where=str(path)))


def _parse(path: Path, suffix: str, text: str) -> Any:
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix == ".toml":
            return tomllib.loads(text)
        import yaml  # the train extra's dependency; only YAML needs it

        return {} if not text.strip() else yaml.safe_load(text)
    except ImportError:
        raise ConfigError(f"--config {path}: reading YAML needs PyYAML (pip install pyyaml, or "
                          "the train extra); or give a .toml or .json file") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--config {path}: not valid {suffix[1:].upper()}: "
                          f"{' '.join(str(exc).split())}") from None
    except Exception as exc:  # yaml.YAMLError, whose module may be absent
        if type(exc).__module__.startswith("yaml"):
            raise ConfigError(f"--config {path}: not valid YAML: "
                              f"{' '.join(str(exc).split())}") from None
        raise


def merge_layers(layers: typing.Iterable[typing.Mapping[str, Any]],
                 exclusive: typing.Mapping[str, str]) -> dict[str, Any]:
    """The layers' settings, a later layer winning. ``exclusive`` maps a setting to the one it
    replaces: a later layer's ``num_episodes`` drops an earlier layer's ``num_steps``, so
    ``--num-episodes`` overrides a recipe's step count instead of conflicting with it."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key in layer:
            partner = exclusive.get(key)
            if partner is not None and partner not in layer:
                merged.pop(partner, None)
        merged.update(layer)
    return merged


# --------------------------------------------------------------------------- the run record

def to_plain(value: Any) -> Any:
    """A settings value as JSON: paths as text, enums as their values, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def settings_record(settings: Any) -> dict[str, Any]:
    """Every init field of ``settings`` as JSON values, in field order."""
    return {f.name: to_plain(getattr(settings, f.name))
            for f in dataclasses.fields(settings) if f.init}


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file in the same folder and a
    rename, so a reader sees the old file or the whole new one, never a part. (The temporary
    file is opened normally, not with mkstemp, so the file gets the usual permissions.)"""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
