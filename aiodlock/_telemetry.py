"""Observability in one place: the log records and the OpenTelemetry spans and metrics of a
lock's state changes.

The core calls this module where a lock changes state, and nowhere else: :func:`acquired`,
:func:`timed_out`, :meth:`Hold.released`, :meth:`Hold.lost`, :func:`renewal_failed` and
:func:`renewal_recovered`. Logs go to ``aiodlock.locks``, one record per state change with the
lock in ``extra=`` fields; OpenTelemetry is used only when installed and configured. Who calls
what, and the records, spans and metrics: docs/core.md and docs/operations.md.

Example (what the core does around one acquisition)::

    hold = acquired(spec, token=7, waited=0.012)
    ...
    hold.released()
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from .backends._protocol import LockSpec

if TYPE_CHECKING:
    from ._exceptions import LockLostError

__all__ = [
    "LOGGER_NAME",
    "Hold",
    "acquired",
    "log_extra",
    "renewal_failed",
    "renewal_recovered",
    "timed_out",
]

LOGGER_NAME: Final = "aiodlock.locks"
logger = logging.getLogger(LOGGER_NAME)

_NS_PER_S: Final = 1_000_000_000
_UNSEEN: Final = object()


def log_extra(spec: LockSpec, token: int | None) -> dict[str, Any]:
    """The ``extra=`` fields of every record about one lock (see the module docstring)."""
    return {
        "aiodlock_namespace": spec.namespace,
        "aiodlock_name": spec.name,
        "aiodlock_kind": spec.kind.value,
        "aiodlock_token": token,
    }


def _attributes(spec: LockSpec) -> dict[str, str]:
    # Metric attributes: bounded values only (a lock name is not).
    return {"aiodlock.namespace": spec.namespace, "aiodlock.kind": spec.kind.value}


def _span_attributes(spec: LockSpec, token: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {**_attributes(spec), "aiodlock.name": spec.name}
    if token is not None:
        attributes["aiodlock.fencing_token"] = token
    return attributes


class _OTel:
    """The tracer and instruments, made once ``opentelemetry-api`` is found."""

    def __init__(self) -> None:
        from opentelemetry import metrics, trace
        from opentelemetry.metrics import NoOpMeterProvider
        from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Status, StatusCode

        # Until the application sets a provider, the global ones are proxies: every span and
        # instrument call would do nothing, at a few microseconds each, on the hot path. Even
        # asking for the provider costs microseconds (the API looks up an environment variable
        # while none is set), so the global the API keeps is read directly where it exists.
        self._tracer_provider = _provider_reader(
            trace, "_TRACER_PROVIDER", trace.get_tracer_provider
        )
        self._meter_provider = _provider_reader(
            importlib.import_module("opentelemetry.metrics._internal"),
            "_METER_PROVIDER",
            metrics.get_meter_provider,
        )
        self._idle_tracers = (ProxyTracerProvider, NoOpTracerProvider)
        self._idle_meters = NoOpMeterProvider
        # The answers of tracing() and metering() for the providers they last saw: the hot
        # path asks per grant, and the providers are set once in an application's life.
        self._seen_tracer: object = _UNSEEN
        self._tracing = False
        self._seen_meter: object = _UNSEEN
        self._metering = False
        self.tracer = trace.get_tracer("aiodlock")
        meter = metrics.get_meter("aiodlock")
        self.grants = meter.create_counter(
            "aiodlock.grants", unit="{grant}", description="locks granted"
        )
        self.timeouts = meter.create_counter(
            "aiodlock.timeouts", unit="{timeout}", description="acquisitions that timed out"
        )
        self.losses = meter.create_counter(
            "aiodlock.losses", unit="{loss}", description="leases lost while held"
        )
        self.wait = meter.create_histogram(
            "aiodlock.wait", unit="s", description="time from acquire() to the grant"
        )
        self.error = Status(StatusCode.ERROR)

    def tracing(self) -> bool:
        """An application configured a tracer provider (spans go somewhere)."""
        provider = self._tracer_provider()
        if provider is not self._seen_tracer:
            self._seen_tracer = provider
            self._tracing = provider is not None and not isinstance(provider, self._idle_tracers)
        return self._tracing

    def metering(self) -> bool:
        """An application configured a meter provider (measurements go somewhere)."""
        provider = self._meter_provider()
        if provider is not self._seen_meter:
            self._seen_meter = provider
            # The API's proxy meter provider has no public name to test against.
            self._metering = not (
                provider is None
                or isinstance(provider, self._idle_meters)
                or type(provider).__name__ == "_ProxyMeterProvider"
            )
        return self._metering


def _provider_reader(
    module: ModuleType, name: str, public: Callable[[], object]
) -> Callable[[], object]:
    """Read the API's global provider ``module.name`` (None while unset), or call ``public``
    if this version of the API keeps it elsewhere.

    ``public()`` is called once first: a provider named by an ``OTEL_PYTHON_*_PROVIDER``
    environment variable is only loaded (and stored in the global) by that call.
    """
    public()
    if not hasattr(module, name):
        return public
    return lambda: getattr(module, name)


_otel: _OTel | None = None
_otel_missing = False


def _telemetry() -> _OTel | None:
    """The OpenTelemetry hooks, or None when ``opentelemetry-api`` is not installed."""
    global _otel, _otel_missing
    if _otel is None and not _otel_missing:
        try:
            _otel = _OTel()
        except ImportError:
            _otel_missing = True
    return _otel


class Hold:
    """One held lease, from its grant to its end: the ``aiodlock.hold`` span and the records.

    :meth:`released` and :meth:`lost` may both be called (a lease lost, then released): the
    first one ends the hold.
    """

    __slots__ = ("_ended", "_granted_ns", "_span", "spec", "token")

    def __init__(self, spec: LockSpec, token: int, span: Any) -> None:
        self.spec = spec
        self.token = token
        self._span = span
        self._granted_ns = time.time_ns()
        self._ended = False

    def released(self) -> None:
        """The holder gave the lease back."""
        if self._ended:
            return
        self._ended = True
        if logger.isEnabledFor(logging.DEBUG):  # the hot path: no work when not logging
            held = (time.time_ns() - self._granted_ns) / _NS_PER_S
            logger.debug(
                "released %s (token %s) after %.3f s",
                self.spec.describe(),
                self.token,
                held,
                extra=log_extra(self.spec, self.token),
            )
        if self._span is not None:
            self._span.end()

    def lost(self, reason: LockLostError) -> None:
        """The lease was lost (renewal refused, session gone, validity passed...)."""
        first = not self._ended
        self._ended = True
        logger.warning(
            "lost %s (token %s): %s",
            self.spec.describe(),
            self.token,
            reason,
            extra=log_extra(self.spec, self.token),
        )
        otel = _telemetry()
        if otel is not None and otel.metering():
            otel.losses.add(1, _attributes(self.spec))
        if first and otel is not None and self._span is not None:
            self._span.set_status(otel.error)
            self._span.add_event("aiodlock.lost", {"aiodlock.reason": str(reason)})
            self._span.end()


def acquired(spec: LockSpec, *, token: int, waited: float) -> Hold:
    """A grant after ``waited`` seconds: log it, count it, trace the wait; the hold begins."""
    if logger.isEnabledFor(logging.DEBUG):  # the hot path: no work when not logging
        logger.debug(
            "acquired %s (token %s) after %.3f s",
            spec.describe(),
            token,
            waited,
            extra=log_extra(spec, token),
        )
    otel = _telemetry()
    if otel is None:
        return Hold(spec, token, None)
    if otel.metering():
        otel.grants.add(1, _attributes(spec))
        otel.wait.record(waited, _attributes(spec))
    if not otel.tracing():
        return Hold(spec, token, None)
    attributes = _span_attributes(spec, token)
    now = time.time_ns()
    span = otel.tracer.start_span(
        "aiodlock.acquire",
        start_time=now - int(waited * _NS_PER_S),
        attributes={**attributes, "aiodlock.wait_seconds": waited},
    )
    span.end(end_time=now)
    hold_span = otel.tracer.start_span("aiodlock.hold", start_time=now, attributes=attributes)
    return Hold(spec, token, hold_span)


def timed_out(spec: LockSpec, *, waited: float) -> None:
    """An acquisition gave up after ``waited`` seconds (``LockTimeoutError``)."""
    logger.debug(
        "timed out waiting for %s after %.3f s",
        spec.describe(),
        waited,
        extra=log_extra(spec, None),
    )
    otel = _telemetry()
    if otel is None:
        return
    if otel.metering():
        otel.timeouts.add(1, _attributes(spec))
    if not otel.tracing():
        return
    now = time.time_ns()
    span = otel.tracer.start_span(
        "aiodlock.acquire",
        start_time=now - int(waited * _NS_PER_S),
        attributes={**_span_attributes(spec, None), "aiodlock.wait_seconds": waited},
    )
    span.set_status(otel.error)
    span.add_event("aiodlock.timeout")
    span.end(end_time=now)


def renewal_failed(spec: LockSpec, token: int, error: BaseException, *, remaining: float) -> None:
    """The first renewal of a streak failed (the watchdog retries within the validity)."""
    logger.warning(
        "renewing %s (token %s) failed: %s; retrying for up to %.3f s before it is lost",
        spec.describe(),
        token,
        error,
        max(remaining, 0.0),
        extra=log_extra(spec, token),
    )


def renewal_recovered(spec: LockSpec, token: int) -> None:
    """A renewal succeeded after a streak of failures."""
    logger.info(
        "renewing %s (token %s) works again", spec.describe(), token, extra=log_extra(spec, token)
    )
