"""Telemetry for cortex: OpenTelemetry spans and Prometheus metrics, off until asked for.

Needs the ``telemetry`` extra (``pip install 'cortex-sessions[telemetry]'``);
``import cortex`` never imports it, nor OpenTelemetry. Two halves:

- the library: :func:`instrument` gives one store a span per public call
  and call metrics (:func:`uninstrument` takes them away);
- an HTTP service: :class:`TelemetryMiddleware`, a plain ASGI middleware
  (a server span per request, continuing the caller's ``traceparent``;
  request metrics; JSON access logs), and :func:`metrics_app`, the ASGI
  app serving a registry's metrics to Prometheus.

docs/telemetry.md lists every span attribute and metric, and what each costs.
"""

from cortex.telemetry._http import UNMATCHED, TelemetryMiddleware, metrics_app
from cortex.telemetry._store import instrument, uninstrument

__all__ = ["UNMATCHED", "TelemetryMiddleware", "instrument", "metrics_app", "uninstrument"]
