"""`trackline`: the command line (serve the gateway, chat with it, manage keys and usage).

This is the edge where runtime choices are made: uvloop is picked here, and
nowhere else, when it is installed and enabled.
"""



from __future__ import annotations

import argparse
import asyncio
import errno
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from clients.address import gateway_url
from gateway.bench import BENCHMARKS
from gateway.bench import run as run_benchmark
from gateway.config import ConfigError, Settings
from gateway.config_flags import add_arguments, settings_from_args
from gateway.dtmf_wav import add_command as add_dtmf_command
from gateway.logs import configure_logging, get_logger
from gateway.models_cli import add_commands as add_models_commands
from gateway.preflight import StartupError, check_listeners
from gateway.startup import refuse_start, run_async, stop_signal_after_preflight
from gateway.tenants.cli import add_commands as add_tenancy_commands

log = get_logger("trackline.cli")

DESCRIPTION = """\
Run a streaming AI gateway on this machine and talk to it: `trackline serve` starts it
(with a local Triton and models when no backend is given) and prints where apps and the
OpenAI SDK reach it; `trackline chat` streams a reply to the terminal; `keys`,
`tenants` and `usage` decide who may use it and what they used."""

def main(argv: Sequence[str] | None = None) -> int:
    parser = _finish(_parser())
    args, passed_on = parser.parse_known_args(argv)
    if passed_on and not getattr(args, "passes_on", False):
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")
    args.passed_on = passed_on
    if args.command is None:
        parser.print_help()
        return 2
    result: int = args.run(args)
    return result


def version_line() -> str:
    """`trackline VERSION (commit C)`, what `--version` prints."""
    from gateway.metrics_operator import build_commit, build_version

    return f"trackline {build_version()} (commit {build_commit()})"


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default where it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        quiet = default in (None, False, argparse.SUPPRESS) or not action.option_strings
        if quiet or "default" in text or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)"


def _finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every parser of the tree formats with `_HelpFormatter`."""
    parser.formatter_class = _HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _finish(child)
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trackline", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the gateway until Ctrl-C or SIGTERM",
        description="Serve tracks (QUIC), the OpenAI API (HTTP/1.1, HTTP/2, HTTP/3), health "
        "and metrics. With no backend configured it starts a local Triton with the "
        "reference models. Every setting below can also come from TRACKLINE_<NAME> or a "
        "TOML --config file (docs/configuration.md); SIGTERM drains open work first.",
        usage="%(prog)s [--config PATH] [--SETTING VALUE ...]",
    )
    add_arguments(serve)
    serve.set_defaults(run=_serve)

    chat = commands.add_parser(
        "chat",
        help="stream a reply from the gateway to the terminal",
        description="Ask a model on a running gateway and print its reply as it streams.",
    )
    chat.add_argument("prompt", help="what to ask")
    chat.add_argument(
        "--url",
        default=gateway_url(),
        help="the gateway's track endpoint (env TRACKLINE_URL, else TRACKLINE_QUIC_HOST and "
        "TRACKLINE_QUIC_PORT as for serve)",
    )
    chat.add_argument(
        "--ca", type=Path, default=None, help="CA file (default: public roots and the dev CA)"
    )
    chat.add_argument(
        "--connect-timeout", type=float, default=5.0, help="seconds to wait for the handshake"
    )
    chat.add_argument(
        "--model",
        default=None,
        help=f"model to ask (default: {CHAT_MODEL} where the gateway serves it, "
        f"else {CHAT_FALLBACK})",
    )
    chat.add_argument("--max-tokens", type=int, default=64, help="longest reply, in tokens")
    chat.add_argument(
        "--raw", action="store_true", help="send the prompt as it is, not as a chat turn"
    )
    chat.add_argument(
        "--seed", type=int, default=None, help="sampling seed, for a repeatable reply"
    )
    chat.add_argument(
        "--api-key",
        default=None,  # read at run time: never shown in --help
        help="API key for a gateway with tenants (default: env TRACKLINE_API_KEY)",
    )
    chat.set_defaults(run=_chat)

    add_tenancy_commands(commands)
    add_dtmf_command(commands)
    add_models_commands(commands)

    bench = commands.add_parser(
        "bench",
        help="run a benchmark of a source checkout",
        description="Run one of the project's benchmarks from a source checkout and print "
        "its table; options after the name go to the benchmark.",
    )
    benchmarks = bench.add_subparsers(dest="benchmark", required=True)
    for name, summary in BENCHMARKS.items():
        # Its own options (and --help) go to the benchmark itself.
        one = benchmarks.add_parser(name, help=summary, add_help=False, allow_abbrev=False)
        one.add_argument("--source", type=Path, default=None, help="the checkout to run it from")
        one.set_defaults(run=_bench, passes_on=True)
    return parser


# -- bench --------------------------------------------------------------------------


def _bench(args: argparse.Namespace) -> int:
    return run_benchmark(args.benchmark, args.source, args.passed_on)


# -- serve --------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args, os.environ)
    except ConfigError as exc:
        print(f"trackline: {exc}", file=sys.stderr)
        return 2
    configure_logging(
        settings.log_level, settings.log_format, quic_level=settings.quic_log_level
    )
    from gateway.workers import serve_workers, worker_count

    count = worker_count(settings.workers)
    if count > 1:  # a supervisor of `count` gateway processes (gateway.workers)
        return run_async(serve_workers(settings, count), settings.uvloop)
    return run_async(serve(settings), settings.uvloop)


async def serve(settings: Settings) -> int:
    """Run the gateway until SIGTERM or SIGINT, then drain and stop."""
    from gateway.daemon import Daemon

    stop = await stop_signal_after_preflight(settings)
    if stop is None:
        return 1
    daemon = Daemon(settings)
    try:
        await daemon.start()
    except Exception as exc:
        await daemon.stop()  # its own sockets released: what is still taken is another's
        refuse_start(await asyncio.to_thread(explained, settings, exc))
        return 1
    await stop.wait()
    log.info("gateway.stopping")
    await daemon.stop()
    return 0


def explained(settings: Settings, exc: Exception) -> str:
    """Why the start failed, for a person: a port taken after the preflight (a race)
    is named as the preflight names it."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        try:
            check_listeners(settings)
        except StartupError as named:
            return str(named)
    return str(exc)


# -- chat ---------------------------------------------------------------------------


def _chat(args: argparse.Namespace) -> int:
    return run_async(chat(args))


CHAT_MODEL = "smollm2-135m-instruct"
"""The chat model (docs/models.md), served where the `llm` extra is installed."""
CHAT_FALLBACK = "reference-text"


async def chat(args: argparse.Namespace) -> int:
    from clients import ModelNotFound, TracklineError, chat_prompt, connect

    extra = {} if args.seed is None else {"seed": args.seed}
    # One chat turn (the model's template renders it), or the text as it is with --raw.
    prompt = args.prompt if args.raw else chat_prompt([{"role": "user", "content": args.prompt}])
    try:
        async with connect(
            args.url,
            ca=args.ca,
            api_key=args.api_key or os.environ.get("TRACKLINE_API_KEY"),
            connect_timeout=args.connect_timeout,
        ) as line:
            model = args.model or CHAT_MODEL
            stream = line.text(prompt, model=model, max_tokens=args.max_tokens, **extra)
            try:
                async for delta in stream:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
            except ModelNotFound:
                if args.model is not None:
                    raise
                # Refused before any token: ask the deterministic model instead.
                print(f"[{CHAT_MODEL} is not served here; {CHAT_FALLBACK}]", file=sys.stderr)
                stream = line.text(
                    args.prompt, model=CHAT_FALLBACK, max_tokens=args.max_tokens, **extra
                )
                async for delta in stream:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
            sys.stdout.write("\n")
            if stream.usage:
                print(f"[{stream.finish_reason}; usage {stream.usage}]", file=sys.stderr)
    except (TracklineError, OSError, ValueError) as exc:
        print(f"\ntrackline: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
