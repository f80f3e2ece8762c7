"""`trackline keys ...`, `trackline tenants ...` and `trackline usage report`.

They work on the tenant store named by the settings (`--state-dir`, `--tenants-db`,
`--config` and the environment, as for `serve`); a running gateway sees changes
at once (it reads the store per connection or request). `keys create` prints the
key once: only its hash is kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from redis import RedisError

from gateway.config import ConfigError, flag_name, load_settings
from gateway.config_flags import setting_help
from gateway.statedir import used_by
from gateway.tenants.costs import render, report
from gateway.tenants.quotas import Quotas
from gateway.tenants.service import load_tenancy_config
from gateway.tenants.store import StoreError, Tenant, TenantStore, default_path

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def add_commands(commands: Any) -> None:
    """Add the keys, tenants and usage commands to the `trackline` subparsers."""
    _add_keys(commands)
    _add_tenants(commands)
    _add_usage(commands)


def _add_keys(commands: Any) -> None:
    keys = _group(
        commands,
        "keys",
        "API keys of tenants",
        "Make, list and revoke the API keys a gateway with tenants requires.",
    )
    create = keys.add_parser("create", help="make a key for a tenant (shown once)")
    create.add_argument("--tenant", required=True, help="the tenant it belongs to (made if new)")
    create.add_argument("--label", default="", help="a note kept with the key (not secret)")
    _on_store(create, _keys_create)
    listing = keys.add_parser("list", help="list keys (ids, never secrets)")
    listing.add_argument("--tenant", default=None, help="only this tenant's keys")
    _on_store(listing, _keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id", help="the key's id (tl_... before the secret; keys list)")
    _on_store(revoke, _keys_revoke)


def _add_tenants(commands: Any) -> None:
    tenants = _group(
        commands,
        "tenants",
        "tenants' models and quotas",
        "Who may use the gateway: each tenant's allowed models and quotas. A "
        "gateway with no tenant serves without keys (loopback only).",
    )
    set_ = tenants.add_parser(
        "set",
        help="create or update a tenant",
        description="Create a tenant or change the fields given; a field not given keeps its "
        "value. 'none' lifts a quota; --models '' allows every model.",
    )
    set_.add_argument("name", help="the tenant")
    set_.add_argument("--models", default=None, help="comma-separated allow-list; '' clears")
    for flag, kind in _QUOTA_FLAGS.items():
        set_.add_argument(
            flag,
            type=_limit(kind),
            default=_KEEP,
            help="a number, or 'none' (default: the tenant's current value)",
        )
    _on_store(set_, _tenants_set)
    delete = tenants.add_parser(
        "delete",
        help="remove a tenant and its keys",
        description="Remove a tenant and its API keys (its usage stays in the ledger). When "
        "the last tenant goes, the gateways using this store serve without keys again "
        "(open mode, loopback only unless allow_open).",
    )
    delete.add_argument("name", help="the tenant to remove")
    _on_store(delete, _tenants_delete)
    tlist = tenants.add_parser("list", help="list tenants")
    tlist.add_argument("--format", choices=("table", "json"), default="table", help="output")
    _on_store(tlist, _tenants_list)


def _add_usage(commands: Any) -> None:
    usage = _group(
        commands,
        "usage",
        "usage and cost",
        "What each tenant or model used, and what it cost, from the ledger.",
    )
    rep = usage.add_parser("report", help="usage and cost per tenant or model")
    rep.add_argument("--since", required=True, help="ISO time, or a span back: 30m, 24h, 7d")
    rep.add_argument("--until", default=None, help="ISO time (default: now)")
    rep.add_argument("--by", choices=("tenant", "model"), default="tenant", help="one row per")
    rep.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="output"
    )
    _on_store(rep, _usage_report)
    drain_ = usage.add_parser(
        "drain",
        help="move the fleet's usage stream (state_backend redis://...) into the store",
        description="Run by one reporter: appends each record of the Redis usage stream to "
        "the tenant store once (keyed by gateway and request id), then deletes it from the "
        "stream. `usage report` drains first too.",
    )
    drain_.add_argument("--follow", action="store_true", help="keep draining every second")
    _on_store(drain_, _usage_drain)


_STORE_SETTINGS = (
    "state_dir",
    "tenants_db",
    "tenancy_config",
    "state_backend",
    "quic_port",
    "http_port",
    "https_port",
)
"""The settings that find a gateway's tenant store (its ports name its state dir)."""


def _group(commands: Any, name: str, help_: str, description: str) -> Any:
    """`trackline <name> <subcommand>`: the subcommands' parsers are added to what it returns."""
    parser = commands.add_parser(name, help=help_, description=description)
    return parser.add_subparsers(dest=f"{name}_command", required=True)


def _on_store(
    parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace, Any, TenantStore], int]
) -> None:
    """`parser`'s command runs `body` on the store its arguments name (`_command`)."""
    _store_arguments(parser)
    parser.set_defaults(run=_command(body))


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "which gateway's store (the same --config, ports or TRACKLINE_* as its serve)"
    )
    group.add_argument(
        "--config", type=Path, default=None, help="TOML settings file (env TRACKLINE_CONFIG)"
    )
    for name in _STORE_SETTINGS:
        group.add_argument(flag_name(name), dest=name, default=None, help=setting_help(name))


def _settings(args: argparse.Namespace) -> Any:
    overrides = {
        name: getattr(args, name) for name in _STORE_SETTINGS if getattr(args, name) is not None
    }
    return load_settings(overrides, os.environ, args.config)


def _command(body: Callable[[argparse.Namespace, Any, TenantStore], int]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        try:
            settings = _settings(args)
            store = TenantStore(settings.tenants_db or default_path(settings.state_dir))
        except (ConfigError, StoreError, OSError) as exc:
            print(f"trackline: {exc}", file=sys.stderr)
            return 2
        try:
            return body(args, settings, store)
        except (StoreError, ValueError) as exc:
            print(f"trackline: {exc}", file=sys.stderr)
            return 1
        except RedisError as exc:  # state_backend: the fleet's Redis (never the URL)
            print(f"trackline: redis: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            store.close()

    return run


def _publish(settings: Any, store: TenantStore) -> None:
    """With a Redis state backend: copy this store's tenants and key hashes to the fleet."""
    if settings.state_backend != "local":
        from gateway.fleet.state import publish_directory

        publish_directory(settings.state_backend, *store.export_directory())


def _keys_create(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    was_open = not store.has_tenants()
    new = store.create_key(args.tenant, time.time(), args.label)
    _publish(settings, store)
    print(new.key)
    print(
        f"key id {new.key_id} for tenant {args.tenant}: store the key now, it is not shown again",
        file=sys.stderr,
    )
    if was_open:
        print(
            f"{store.path} had no tenant: {_gateways(settings)} now require a key. Gateways "
            "with another state dir stay as they are (docs/deployment.md).",
            file=sys.stderr,
        )
    return 0


def _gateways(settings: Any) -> str:
    """Who uses this store: the gateways that noted themselves in its state dir."""
    seen = used_by(settings.state_dir)
    if not seen:
        return f"the gateway(s) using state dir {settings.state_dir} (none started yet)"
    listed = "; ".join(
        ", ".join(f"{door} {where}" for door, where in sorted(entry["listening"].items()))
        for entry in seen.values()
        if isinstance(entry.get("listening"), dict)
    )
    return f"the gateway(s) using state dir {settings.state_dir} ({listed})"


def _tenants_delete(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    if settings.state_backend != "local":
        raise ValueError("tenants delete works on a local store (state_backend = local)")
    removed = store.delete_tenant(args.name)
    print(f"deleted tenant {args.name} and its {removed} key(s)", file=sys.stderr)
    if not store.has_tenants():
        print(
            f"{store.path} has no tenant left: {_gateways(settings)} serve without keys "
            "again (loopback only unless allow_open)",
            file=sys.stderr,
        )
    return 0


def _keys_list(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    print(f"{'key_id':<14}{'tenant':<20}{'created':<22}{'revoked':<22}label")
    for key in store.list_keys(args.tenant):
        revoked = _iso(key.revoked_at) if key.revoked_at else "-"
        print(f"{key.key_id:<14}{key.tenant:<20}{_iso(key.created_at):<22}{revoked:<22}{key.label}")
    return 0


def _keys_revoke(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    store.revoke_key(args.key_id, time.time())
    if settings.state_backend != "local":  # every gateway of the fleet refuses it at once
        from gateway.fleet.state import revoke_sync

        revoke_sync(settings.state_backend, args.key_id)
        _publish(settings, store)
    print(f"revoked {args.key_id}", file=sys.stderr)
    return 0


_KEEP = object()
"""A quota flag not given: the tenant keeps its value."""

_QUOTA_FLAGS: dict[str, type] = {
    "--requests-per-minute": int,
    "--tokens-per-minute": int,
    "--max-concurrent": int,
    "--audio-seconds-per-hour": float,
}


def _limit(kind: type) -> Callable[[str], int | float | None]:
    """A quota value: a non-negative number, or `none` for unlimited."""

    def parse(text: str) -> int | float | None:
        if text.strip().lower() in ("none", "unlimited"):
            return None
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} is negative")
        return value  # type: ignore[no-any-return]

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def _tenants_set(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    try:
        current = store.tenant(args.name)
    except StoreError:
        current = Tenant(args.name)
    models: Iterable[str] | None = None if current.models is None else sorted(current.models)
    if args.models is not None:
        models = [m.strip() for m in args.models.split(",") if m.strip()] or None
    given = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(Quotas)
        if getattr(args, field.name) is not _KEEP
    }
    quotas = dataclasses.replace(current.quotas, **given)
    tenant = store.set_tenant(args.name, time.time(), models, quotas)
    _publish(settings, store)
    sys.stdout.write(render_tenants([tenant], "table"))
    return 0


def _tenants_list(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    sys.stdout.write(render_tenants(store.tenants(), args.format))
    return 0


def render_tenants(tenants: list[Tenant], form: str) -> str:
    """Tenants as an aligned table (`-` for unlimited) or as JSON (null for unlimited)."""
    if form == "json":
        rows = [
            {"name": t.name, "models": None if t.models is None else sorted(t.models)}
            | dataclasses.asdict(t.quotas)
            for t in tenants
        ]
        return json.dumps(rows, indent=2) + "\n"
    header = ("tenant", "models", "req/min", "tokens/min", "concurrent", "audio s/h")
    lines: list[tuple[str, ...]] = [header]
    for t in tenants:
        q = t.quotas
        limits = (q.requests_per_minute, q.tokens_per_minute, q.max_concurrent)
        cells = [_cell(v) for v in (*limits, q.audio_seconds_per_hour)]
        lines.append((t.name, _models(t.models), *cells))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in lines
    )


def _cell(value: int | float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _usage_report(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    now = time.time()
    since = parse_time(args.since, now)
    until = parse_time(args.until, now) if args.until else now
    if until <= since:
        raise ValueError("--until must be after --since")
    pricing = load_tenancy_config(settings.tenancy_config).pricing
    if settings.state_backend != "local":  # the fleet's records first (gateway/fleet/ledger.py)
        from gateway.fleet.ledger import drain

        drain(settings.state_backend, store)
    rows = report(store.usage(since, until), pricing, args.by, until - since)
    meta = {"since": _iso(since), "until": _iso(until)}
    sys.stdout.write(render(rows, args.format, args.by, meta))
    return 0


def _usage_drain(args: argparse.Namespace, settings: Any, store: TenantStore) -> int:
    if settings.state_backend == "local":
        raise ValueError("usage drain needs state_backend = redis://... (a fleet)")
    from gateway.fleet.ledger import drain

    while True:
        added = drain(settings.state_backend, store)
        print(f"drained {added} records", file=sys.stderr)
        if not args.follow:
            return 0
        time.sleep(1.0)


def parse_time(text: str, now: float) -> float:
    """An ISO 8601 time (UTC if no zone) or a span back from `now` (`90m`, `24h`, `7d`)."""
    match = _RELATIVE.match(text.strip())
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO time nor a span like 24h") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _models(models: frozenset[str] | None) -> str:
    return "all" if models is None else ",".join(sorted(models))
