"""The configuration reference: one table per service, generated from the settings classes themselves.

``python -m launcher config-reference > docs/configuration.md``; a test regenerates it and compares, so
the document cannot drift from the code.
"""

from __future__ import annotations

import importlib
import typing

from pydantic.fields import FieldInfo

# (service, module holding its settings class, class name)
SETTINGS = [
    ("retriever", "services.retriever.config", "RetrieverSettings"),
    ("inference", "services.inference.config", "InferenceSettings"),
    ("rollout", "services.rollout.config", "RolloutSettings"),
    ("searcher", "services.searcher.config", "SearcherSettings"),
    ("trainer", "services.trainer.config", "TrainerSettings"),
    ("stack", "launcher.config", "StackSettings"),
    # Not a service: the RL-health alerts' thresholds, read by `make train` and the Prometheus rules generator.
    ("RL-health alerts", "launcher.alerts.settings", "AlertSettings"),
]

HEADER = """# Configuration reference

Generated from the settings classes by `python -m launcher config-reference`; do not edit by hand.

Every service reads, lowest to highest precedence: the defaults below < its table of the recipe TOML
(`CODA_RECIPE=configs/….toml` or `--recipe`) < environment variables < command-line flags (`--field-name`).
Unknown keys are errors. List and table values take JSON in environment variables and flags.

One value is read from the environment only, by every service: `CODA_CONTROL_TOKEN`, the secret that the
routes which change a service's state (the policy server's weight loading, pause and resume) require as
`Authorization: Bearer <token>`; unset, they answer loopback clients only (`shared/auth.py`,
[security.md](security.md)). It is never a recipe key (recipes are committed) nor a flag (`ps` shows flags).
"""


def shared_section(classes: list[tuple[str, type]]) -> list[str]:
    """The ``[shared]`` table: each key and the fields it sets, per service."""
    from shared.contract import CONTRACT_KEY, PipelineContract
    from shared.settings import SHARED_KEYS

    contract = ", ".join(f"`{key}`" for key in PipelineContract.model_fields)
    rows = [
        "\n## `[shared]` — values several services read, written once\n",
        "A service's own table wins over `[shared]` where both set a key.\n",
        f"The pipeline contract (`shared/contract.py`: {contract}) is what the rollout and the trainer must "
        f"agree on: each announces its own in Redis (`{CONTRACT_KEY}`) at start-up and refuses to start against "
        "a differing one, naming the fields. Set it here, once. `make train` forgets the announcement each time "
        f"it starts the two; elsewhere a deliberate change of recipe on the same Redis deletes it first "
        f"(`redis-cli DEL {CONTRACT_KEY}`).\n",
        "| key | sets |",
        "|---|---|",
    ]
    for key in sorted(SHARED_KEYS):
        sets = [f"`[{cls.toml_section}] {cls.shared_keys[key]}`" for _, cls in classes if key in cls.shared_keys]
        rows.append(f"| `{key}` | {', '.join(sets)} |")
    return rows


def settings_class(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def _type_name(annotation) -> str:
    text = str(annotation) if typing.get_origin(annotation) else getattr(annotation, "__name__", str(annotation))
    return text.replace("typing.", "").replace("NoneType", "None")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return repr(field.default_factory())
    return repr(field.default)


def _table(fields: dict[str, FieldInfo]) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, field in fields.items():
        desc = (field.description or "").replace("|", "\\|")
        kind = _type_name(field.annotation).replace("|", "\\|")
        default = _default(field).replace("|", "\\|")
        rows.append(f"| `{key}` | `{kind}` | `{default}` | {desc} |")
    return rows


def _tables(cls: type) -> dict[str, type]:
    """The fields that are nested tables (a model of their own: the rollout's agent knobs, ``[rollout.coda]``, …)."""
    from pydantic import BaseModel

    return {
        name: field.annotation
        for name, field in cls.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }


def moved_section(cls: type) -> list[str]:
    """The keys of the release before that still set a nested table's key or a renamed key, with a warning."""
    section, prefix = cls.toml_section, cls.model_config.get("env_prefix", "")
    rows = [
        f"\nThe keys of the release before still set these (`[{section}] key`, `{prefix}KEY`, `--key`), "
        "each use with a logged warning naming the new key; they go in the next release. One place (the recipe, "
        "the environment, the command line) that sets a key both ways is an error.\n",
        "| old key | now |",
        "|---|---|",
    ]
    for old, moved in cls.moved_keys.items():
        table, _, key = moved.rpartition(".")
        rows.append(f"| `{old}` | `[{section}.{table}] {key}` |" if table else f"| `{old}` | `[{section}] {key}` |")
    return rows


def render() -> str:
    parts = [HEADER]
    parts += shared_section([(service, settings_class(module, name)) for service, module, name in SETTINGS])
    for service, module, name in SETTINGS:
        cls = settings_class(module, name)
        prefix = cls.model_config.get("env_prefix", "")
        tables = _tables(cls)
        section = cls.toml_section
        parts.append(f"\n## `[{section}]` — {service} (`{module}.{name}`, env `{prefix}…`)\n")
        parts += _table({k: f for k, f in cls.model_fields.items() if k not in tables})
        if tables:
            parts.append(
                f"\nNested tables: `[{section}.TABLE] key`, env `{prefix}TABLE__KEY`, flag `--table JSON`"
                + (
                    " (each agent's own knobs, defined beside it in its params model, one table per agent module)."
                    if section == "rollout"
                    else "."
                )
            )
        if cls.moved_keys:
            parts += moved_section(cls)
        for table, model in tables.items():
            summary = (model.__doc__ or "").strip().splitlines()[0]
            parts.append(f"\n### `[{section}.{table}]` — `{model.__module__}.{model.__name__}`: {summary}\n")
            parts += _table(model.model_fields)
    return "\n".join(parts) + "\n"
