"""`llama-srb serve | models | model-path`: flags generated from the Settings declarations."""

from __future__ import annotations

import argparse
import enum
import gc
import logging
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from llama_srb.bundled_model import BUNDLED, DEFAULT, bundled_model_path
from llama_srb.config import Settings


def _flag_type(annotation: Any) -> tuple[Any, list[str] | None]:
    """argparse type and choices for a Settings annotation (Optional unwrapped)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return str, [m.value for m in annotation]
    if annotation in (int, float):
        return annotation, None
    return str, None  # paths, strings, comma lists: Settings parses them


# Other spellings of a flag: `--n` is what the tool this server replaces called --max-n.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {"max_n": ("--n",)}
REPEATABLE = {"api_key", "model"}  # flags given once per value


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, info in Settings.model_fields.items():
        flags = (f"--{name.replace('_', '-')}", *FLAG_ALIASES.get(name, ()))
        kind, choices = _flag_type(info.annotation)
        env = f"LLAMA_SRB_{name.upper()}"
        default = info.default.value if isinstance(info.default, enum.Enum) else info.default
        if isinstance(default, list):  # as the flag takes it: comma-separated
            default = ",".join(default)
        if info.annotation is bool:  # a switch: --log-prompts / --no-log-prompts
            parser.add_argument(
                *flags,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{info.description} [env {env}; default {default}]",
            )
            continue
        parser.add_argument(
            *flags,
            dest=name,
            type=kind,
            choices=choices,
            action="append" if name in REPEATABLE else "store",
            default=None,  # unset flags leave the environment and the declared default in charge
            help=f"{info.description} [env {env}; default {default}]",
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    if "model" in given:  # a repeated --model: the first is the default, the rest on demand
        first, *more = given["model"]
        given["model"] = first
        if more:
            given["models"] = more + _comma_list(given.get("models"))
    return Settings(**given)


def _comma_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="llama-srb", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the OpenAI-compatible server")
    add_settings_flags(serve)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    path = commands.add_parser("model-path", help="print a bundled model's path (checked once)")
    path.add_argument("name", nargs="?", default=DEFAULT, choices=list(BUNDLED))
    commands.add_parser("models", help="list the bundled models, their packages and paths")
    args = parser.parse_args(argv)

    if args.command == "model-path":
        print(bundled_model_path(args.name))
        return
    if args.command == "models":
        list_models()
        return
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        sys.exit(f"llama-srb: invalid settings:\n{exc}")
    serve_forever(settings, args.log_level)


def list_models() -> None:
    for bundled in BUNDLED.values():
        try:
            where = str(bundled.locate())
        except (OSError, ValueError) as exc:
            where = f"unavailable: {exc}"
        default = " (default)" if bundled.name == DEFAULT else ""
        print(f"{bundled.name}{default}\n  {bundled.about}\n  package: {bundled.package}")
        print(f"  path: {where}")


def serve_forever(settings: Settings, log_level: str) -> None:
    import uvicorn

    from llama_srb.api.app import create_app
    from llama_srb.api.connections import limited_protocol
    from llama_srb.api.shutdown import serve
    from llama_srb.rpc import RpcUnavailable, check_reachable

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings.resolved_model_path()  # assemble the bundled model before listening
    if settings.rpc:
        try:
            check_reachable(settings.rpc)
        except RpcUnavailable as exc:
            sys.exit(f"llama-srb: {exc}")
    app = create_app(settings)
    state = app.state.srb
    trusted = settings.trusted_proxies or []
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        http=limited_protocol(state.connections),  # header timeout, connection caps
        timeout_keep_alive=settings.idle_timeout,  # type: ignore[arg-type]  # float works
        proxy_headers=bool(trusted),  # uvicorn would trust loopback's X-Forwarded-For
        forwarded_allow_ips=trusted,
    )
    # What start-up made (modules, the app and its schemas) lives as long as the server: a
    # full collection of the cyclic GC walked it all, 20-57 ms inside a request's step.
    gc.freeze()
    serve(config, state)  # graceful on SIGTERM: see api/shutdown.py


if __name__ == "__main__":
    main()
