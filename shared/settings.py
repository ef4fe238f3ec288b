"""Base for every service's settings: one pydantic-settings class per service.

Precedence, lowest to highest: field defaults < the recipe's TOML section < environment < command line.
A recipe (``configs/*.toml``) describes one experiment for all services; each service reads its own table
(``[retriever]``, ``[rollout]``, …). Unknown keys are errors (``extra="forbid"``) so typos never pass silently.
Values several services read (the model, the pipeline contract of ``shared.contract``: the step size, the
staleness bound, the sampling temperature, stream and key names) are written once in a ``[shared]`` table: each
service takes the ones it uses (``shared_keys``: shared name → its own field), and its own table wins where
both set one. ``contract()`` is the pipeline contract as a service holds it.

A field that is a model of its own is a nested table (``[trainer.lora]``, env ``CODA_TRAINER_LORA__RANK``, flag
``--lora JSON``). Keys that moved into one, or were renamed, keep their old spelling for one release
(``moved_keys``: old key → ``table.key`` or the new flat key): ``[trainer] lora_rank``, ``CODA_TRAINER_LORA_RANK``
and ``--lora-rank`` set ``lora.rank``; ``[rollout] model_name`` sets ``served_model_name``; each at its own
precedence, with a logged warning that names the new key. One place (the recipe, the environment, the command
line) that sets a key both ways is an error naming both; an old key in the service's own table still wins over
the new one in ``[shared]``.

    class RetrieverSettings(ServiceSettings):
        model_config = service_config("CODA_RETRIEVER_")
        toml_section: ClassVar[str] = "retriever"
        port: int = Field(8000, description="HTTP port")

    settings = RetrieverSettings.load(recipe="configs/tiny-cpu.toml", port=9000)
"""

from __future__ import annotations

import argparse
import contextvars
import json
import logging
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from shared.contract import PipelineContract

RECIPE_ENV = "CODA_RECIPE"
# [shared] keys, each read by the services that declare it in ``shared_keys``: the pipeline contract's fields
# and a few more that are the same for every service reading them.
SHARED_KEYS = frozenset({"model", "system_prompt", "env_turn", "redis_url", *PipelineContract.model_fields})
log = logging.getLogger(__name__)
_recipe: contextvars.ContextVar[str | None] = contextvars.ContextVar("coda_recipe", default=None)


def service_config(env_prefix: str, **extra: Any) -> SettingsConfigDict:
    """The house ``model_config``: an env prefix, unknown keys forbidden, nested env with ``__``."""
    return SettingsConfigDict(
        env_prefix=env_prefix, extra="forbid", env_nested_delimiter="__", validate_default=True, **extra
    )


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The whole recipe TOML as a dict, with a clear error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"recipe {path} is not valid TOML: {exc}") from exc


class TomlSectionSource(PydanticBaseSettingsSource):
    """Settings from one table of the recipe file (the service's section)."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        path: str | None,
        section: str,
        shared_keys: dict[str, str] | None = None,
    ) -> None:
        super().__init__(settings_cls)
        self.values: dict[str, Any] = {}
        if path:
            recipe = read_recipe(path)
            table, shared = recipe.get(section, {}), recipe.get("shared", {})
            for name, value in (("[" + section + "]", table), ("[shared]", shared)):
                if not isinstance(value, dict):
                    raise ValueError(f"recipe {path}: {name} must be a table")
            unknown = set(shared) - SHARED_KEYS
            if unknown:
                raise ValueError(
                    f"recipe {path}: unknown [shared] keys {sorted(unknown)}; known: {', '.join(sorted(SHARED_KEYS))}"
                )
            # An old spelling in the service's own table (``moved_keys``) wins over [shared] like the new one would.
            renamed = {new: old for old, new in getattr(settings_cls, "moved_keys", {}).items() if "." not in new}
            own = {
                field: shared[key]
                for key, field in (shared_keys or {}).items()
                if key in shared and renamed.get(field) not in table
            }
            self.values = {**own, **table}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


class MovedKeys(PydanticBaseSettingsSource):
    """Another source's values with the old flat keys of nested tables moved into their tables, each with a
    warning naming the new key; for the environment, also the old flat variables (``PREFIX<KEY>``), which the
    environment source does not read. ``where``: the recipe, the environment or the command line."""

    def __init__(
        self, settings_cls: type[ServiceSettings], source: PydanticBaseSettingsSource, where: str, env: bool = False
    ) -> None:
        super().__init__(settings_cls)
        self.source, self.where, self.env = source, where, env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ answers for the whole source

    def _old_variables(self) -> dict[str, Any]:
        cls = self.settings_cls
        prefix = cls.model_config.get("env_prefix", "").lower()
        env = {k.lower(): v for k, v in os.environ.items()}
        out = {}
        for key in cls.moved_keys:
            raw = env.get(prefix + key)
            if raw is not None:
                out[key] = _parse_cli_value(raw, cls.moved_field(key))
        return out

    def _spelling(self, key: str) -> str:
        """``key`` (flat, or ``table.key``) as this place writes it."""
        cls = self.settings_cls
        table, _, inner = key.rpartition(".")
        if self.env:
            prefix = cls.model_config.get("env_prefix", "")
            return prefix + (f"{table}__{inner}" if table else key).upper()
        if self.where == "the command line":
            return f"--{table.replace('_', '-')} '{{\"{inner}\": …}}'" if table else "--" + key.replace("_", "-")
        return f"[{cls.toml_section}.{table}] {inner}" if table else f"[{cls.toml_section}] {key}"

    def __call__(self) -> dict[str, Any]:
        values = dict(self.source())
        if self.env:
            values.update(self._old_variables())
        for key, moved in self.settings_cls.moved_keys.items():
            if key not in values:
                continue
            old, new = self._spelling(key), self._spelling(moved)
            if "." not in moved:  # a renamed flat key
                if moved in values:
                    raise ValueError(f"{self.where} sets {old} and {new}, the same setting: keep {new}")
                values[moved] = values.pop(key)
                _warn_moved(self.where, old, new)
                continue
            table, inner = moved.split(".")
            nested = values.get(table) or {}
            nested = nested.model_dump(exclude_unset=True) if isinstance(nested, BaseModel) else nested
            if not isinstance(nested, dict):
                continue  # not a table: validation refuses it, and the old key with it
            if inner in nested:
                raise ValueError(f"{self.where} sets {old} and {new}, the same setting: keep {new}")
            values[table] = {**nested, inner: values.pop(key)}
            _warn_moved(self.where, old, new)
        return values


def _warn_moved(where: str, old: str, new: str) -> None:
    log.warning(
        "%s: %s is now %s; the old key goes in the next release",
        where,
        old,
        new,
        extra={"old_key": old, "new_key": new},
    )


class ServiceSettings(BaseSettings):
    """Subclass per service; set ``model_config = service_config(PREFIX)`` and ``toml_section``."""

    model_config = service_config("CODA_")
    toml_section: ClassVar[str] = "common"
    shared_keys: ClassVar[dict[str, str]] = {}  # [shared] key → this service's field
    contract_fields: ClassVar[dict[str, str]] = {}  # pipeline contract field → this service's field
    # an old flat key → ``table.key``, where it moved (a nested table: a model field), or → its new flat name;
    # the old one still works, with a warning, for one release
    moved_keys: ClassVar[dict[str, str]] = {}

    @classmethod
    def moved_field(cls, key: str) -> FieldInfo:
        """The field an old flat key (``moved_keys``) now sets."""
        table, _, inner = cls.moved_keys[key].rpartition(".")
        return cls.model_fields[table].annotation.model_fields[inner] if table else cls.model_fields[inner]

    def contract_values(self) -> dict[str, Any]:
        """The fields of the pipeline contract this service holds, under the contract's names."""
        return {name: getattr(self, field) for name, field in self.contract_fields.items()}

    def contract(self) -> PipelineContract:
        """The pipeline contract as this service holds it (the rollout and the trainer hold all of it)."""
        values = self.contract_values()
        missing = sorted(set(PipelineContract.model_fields) - set(values))
        if missing:
            raise TypeError(f"{type(self).__name__} holds only part of the pipeline contract (not {missing})")
        return PipelineContract(**values)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        recipe = _recipe.get() or os.environ.get(RECIPE_ENV)
        toml = TomlSectionSource(settings_cls, recipe, cls.toml_section, cls.shared_keys)
        # First wins: command line (init kwargs) > environment > recipe > defaults.
        if not cls.moved_keys:
            return init_settings, env_settings, toml
        return (
            MovedKeys(settings_cls, init_settings, "the command line"),
            MovedKeys(settings_cls, env_settings, "the environment", env=True),
            MovedKeys(settings_cls, toml, f"recipe {recipe}"),
        )

    @classmethod
    def load(cls, recipe: str | Path | None = None, **overrides: Any):
        """Build the settings from a recipe file (or ``$CODA_RECIPE``), the environment and overrides."""
        token = _recipe.set(str(recipe) if recipe else None)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        finally:
            _recipe.reset(token)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One ``--flag`` per field (help from its description) plus ``--recipe``."""
        parser.add_argument(
            "--recipe", default=None, help=f"recipe TOML; its [{cls.toml_section}] table is read (env: {RECIPE_ENV})"
        )
        group = parser.add_argument_group(
            f"{cls.toml_section} settings (env prefix {cls.model_config.get('env_prefix', '')})"
        )
        for name, field in cls._flag_fields().items():
            flag = "--" + name.replace("_", "-")
            default = field.default if field.default is not None else "none"
            text = f"{field.description or ''} (default: {default})"
            if name in cls.moved_keys:
                table, _, inner = cls.moved_keys[name].rpartition(".")
                new = f"--{table.replace('_', '-')} '{{\"{inner}\": …}}'" if table else "--" + inner.replace("_", "-")
                text = f"old spelling of {new} (goes in the next release)"
            group.add_argument(flag, dest=f"setting__{name}", default=None, metavar=_metavar(field), help=text)

    @classmethod
    def _flag_fields(cls) -> dict[str, FieldInfo]:
        """The fields with a flag: every field, and each moved key under its old flat name."""
        return {**cls.model_fields, **{key: cls.moved_field(key) for key in cls.moved_keys}}

    @classmethod
    def from_args(cls, args: argparse.Namespace):
        """Settings from parsed ``add_arguments`` flags (flags left out fall through to env/recipe/defaults)."""
        overrides = {}
        for name, field in cls._flag_fields().items():
            raw = getattr(args, f"setting__{name}", None)
            if raw is not None:
                overrides[name] = _parse_cli_value(raw, field)
        return cls.load(getattr(args, "recipe", None), **overrides)


def _is_complex(annotation: Any) -> bool:
    """True for list/dict/model fields, which take JSON on the command line."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_complex(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin in (list, dict, tuple, set):
        return True
    return isinstance(annotation, type) and issubclass(annotation, (BaseModel, list, dict))


def _metavar(field: FieldInfo) -> str:
    return "JSON" if _is_complex(field.annotation) else "VALUE"


def _parse_cli_value(raw: str, field: FieldInfo) -> Any:
    if _is_complex(field.annotation):
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected JSON for this setting, got {raw!r}: {exc}") from exc
    return raw
