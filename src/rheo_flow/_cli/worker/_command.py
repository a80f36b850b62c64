"""``rheo-flow worker``: run consumer groups and pipelines as a service process."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..._backends._urls import redact_url
from ..._model._errors import InvalidArgument, RheoError, UnknownGroup, UnknownStream

if TYPE_CHECKING:  # the runtimes load when the command runs
    from ._run import WorkerConfig

__all__ = ["worker"]

log = logging.getLogger("rheo_flow.worker")


class LogFormat(StrEnum):
    """How log records are written to stderr."""

    text = "text"
    json = "json"


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _configure_logging(level: str, fmt: LogFormat) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt is LogFormat.json:
        formatter: logging.Formatter = _JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(name)s: "
                                      "%(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def _fail(message: str, status: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(status)


LogFormatOption = Annotated[LogFormat, typer.Option(
    case_sensitive=False, help="text or json (one object per line).")]
RetentionIntervalOption = Annotated[str, typer.Option(
    help="How often to apply the retention policy of each stream the worker consumes "
         "(a duration: 30s, 5m, 1h; 0 turns it off).")]
MetricsOption = Annotated[bool | None, typer.Option(
    "--metrics/--no-metrics", show_default=False,
    help="Serve GET /metrics (Prometheus) and /metrics/lag (JSON) on the health port. "
         "Default: on with --health-port when the prometheus extra is installed.")]
MetricsIntervalOption = Annotated[str, typer.Option(
    help="How long one read of the store's lag report serves scrapes (a duration).")]
MetricsStreamsOption = Annotated[str | None, typer.Option(
    show_default=False, help="Streams of the store gauges, comma-separated (default: the "
                             "consumed ones; with --processes every stream).")]
ProbeIntervalOption = Annotated[str, typer.Option(
    help="How often readiness reads the store (a duration; 0 turns the probe off): "
         "/readyz answers 503 while the store does not answer.")]
ProbeTimeoutOption = Annotated[str, typer.Option(
    help="How long a readiness probe may take before the store counts as unreachable.")]
UrlOption = Annotated[str | None, typer.Option(
    "--url", "-u", envvar="RHEO_URL", show_envvar=True,
    help="Backend URL: sqlite:///path.db, postgresql://..., redis://..., mongodb://...")]
ProcessesOption = Annotated[int, typer.Option(
    min=1, max=256, help="Worker processes, each running the same runtimes.")]
GraceOption = Annotated[float, typer.Option(
    min=0, help="On SIGTERM/SIGINT, how long running handlers and batches may take "
                "to finish before what is left is handed back.")]
UntilEmptyOption = Annotated[bool, typer.Option(
    "--until-empty", help="Exit 0 once the backlog seen at the start is settled.")]
HealthFileOption = Annotated[Path | None, typer.Option(
    dir_okay=False, help="Touch this file while ready; removed when draining or exiting.")]
HealthPortOption = Annotated[int | None, typer.Option(
    min=0, max=65535, help="Serve GET /healthz and /readyz (and /metrics) on this port.")]
HealthHostOption = Annotated[str, typer.Option(help="Address the health endpoint listens on.")]
HealthIntervalOption = Annotated[float, typer.Option(
    min=0.05, help="Seconds between touches of the health file.")]
LogLevelOption = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")]


def _seconds(interval: str, option: str = "--retention-interval") -> float:
    """A duration option in seconds (0: off); a bad one is a usage error."""
    from .._times import parse_duration

    if interval.strip() == "0":
        return 0.0
    try:
        return parse_duration(interval).total_seconds()
    except typer.BadParameter as exc:
        raise typer.BadParameter(exc.message, param_hint=option) from None


def worker(
    target: Annotated[str, typer.Argument(
        metavar="MODULE:ATTR",
        help="What to run: a Consumer class or instance, a @consumer function, a Pipeline "
             "or a (sync or async) factory taking the Rheo instance and returning one "
             "of these or a list of them.",
    )],
    url: UrlOption = None,
    processes: ProcessesOption = 1,
    grace_seconds: GraceOption = 30.0,
    until_empty: UntilEmptyOption = False,
    health_file: HealthFileOption = None,
    health_port: HealthPortOption = None,
    health_host: HealthHostOption = "0.0.0.0",
    health_interval: HealthIntervalOption = 5.0,
    retention_interval: RetentionIntervalOption = "60s",
    metrics: MetricsOption = None,
    metrics_interval: MetricsIntervalOption = "5s",
    metrics_streams: MetricsStreamsOption = None,
    probe_interval: ProbeIntervalOption = "5s",
    probe_timeout: ProbeTimeoutOption = "2s",
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Run consumer groups or pipelines until SIGTERM/SIGINT, then drain gracefully.

    On the first signal the worker stops fetching, hands back at once the leases
    no handler has started (another worker takes them without waiting for their
    expiry), lets running handlers and open batches finish and settle, and exits
    0 within --grace-seconds (1 when the grace period ran out: what was left
    was handed back). A second signal exits at once. Exit status 2: bad usage.
    """
    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise _fail(f"unknown --log-level {log_level!r}", 2)
    _configure_logging(level, log_format)
    if not url:
        raise _fail("no backend URL: pass --url or set RHEO_URL", 2)
    from ._run import WorkerConfig  # the runtimes load only when a worker runs

    config = WorkerConfig(
        target=target, url=url, grace_seconds=grace_seconds, until_empty=until_empty,
        health_file=health_file, health_port=health_port, health_host=health_host,
        health_interval=health_interval, retention_interval=_seconds(retention_interval),
        metrics=_metrics_on(metrics, health_port),
        metrics_interval=_positive(metrics_interval, "--metrics-interval"),
        metrics_streams=_streams(metrics_streams),
        probe_interval=_seconds(probe_interval, "--probe-interval"),
        probe_timeout=_positive(probe_timeout, "--probe-timeout"))
    raise typer.Exit(_run(config, processes, level, log_format))


def _metrics_on(asked: bool | None, health_port: int | None) -> bool:
    """Whether ``/metrics`` is served: asked for (a usage error without a health port or
    without the extra), or by default with a health port when the extra is installed."""
    from ..metrics._exporter import MISSING_EXTRA, available

    if asked is None:
        if health_port is not None and not available():
            log.info("no /metrics: %s", MISSING_EXTRA)
        return health_port is not None and available()
    if asked and health_port is None:
        raise _fail("--metrics needs --health-port (it is served on the health port)", 2)
    if asked and not available():
        raise _fail(MISSING_EXTRA, 2)
    return asked


def _positive(duration: str, option: str) -> float:
    seconds = _seconds(duration, option)
    if seconds <= 0:
        raise typer.BadParameter("must be above 0", param_hint=option)
    return seconds


def _streams(names: str | None, option: str = "--metrics-streams") -> tuple[str, ...] | None:
    """``a,b`` as stream names (``None``: the default)."""
    if names is None:
        return None
    found = tuple(name.strip() for name in names.split(",") if name.strip())
    if not found:
        raise typer.BadParameter("no stream named", param_hint=option)
    return found


def _run(config: WorkerConfig, processes: int, level: str, log_format: LogFormat) -> int:
    """Load the target and run it (in ``processes`` child processes when more than one);
    the exit status, or :class:`typer.Exit` with 2 for bad usage, 1 for a failure."""
    from .._common import existing, print_error, shown
    from ._run import load_target, run_worker
    from ._supervisor import supervise

    url = config.url
    try:
        loaded = load_target(config.target)
    except InvalidArgument as exc:
        raise _fail(str(exc), 2) from None
    try:
        if processes > 1:
            return asyncio.run(supervise(config, processes,
                                         _child_argv(config, level, log_format)))
        return asyncio.run(run_worker(config, loaded))
    except (UnknownStream, UnknownGroup) as exc:
        from .._unknown import unknown_message

        print_error(exc, url, unknown_message(exc, existing(url)))
        raise typer.Exit(1) from None
    except InvalidArgument as exc:
        raise _fail(shown(str(exc), url), 2) from None
    except RheoError as exc:
        print_error(exc, url)
        raise typer.Exit(1) from None
    except Exception as exc:
        log.error("worker failed (%s): %s", redact_url(url),
                  shown(f"{type(exc).__name__}: {exc}", url))
        log.debug("worker failure traceback", exc_info=exc)
        raise typer.Exit(1) from None


def _child_argv(config: WorkerConfig, level: str, log_format: LogFormat) -> list[str]:
    """The arguments of each child process of ``--processes`` (the URL goes in RHEO_URL)."""
    argv = [config.target, "--grace-seconds", str(config.grace_seconds),
            "--health-interval", str(config.health_interval),
            "--probe-interval", f"{round(config.probe_interval * 1000)}ms"
            if config.probe_interval > 0 else "0",
            "--probe-timeout", f"{round(config.probe_timeout * 1000)}ms",
            "--retention-interval", f"{round(config.retention_interval * 1000)}ms"
            if config.retention_interval > 0 else "0",
            "--log-level", level, "--log-format", log_format.value]
    if config.until_empty:
        argv.append("--until-empty")
    return argv
