"""OTLP/gRPC trace receiver: ``TraceService/Export`` over HTTP/2 (needs the ``grpc`` extra).

vLLM and SGLang export over gRPC by default (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc``, port
4317); this receiver takes those exports into the same :class:`SpanStore` as the OTLP/HTTP one::

    store = SpanStore()
    async with OTLPGrpcReceiver(store) as receiver:      # 127.0.0.1, a free port
        receiver.endpoint                                # "http://127.0.0.1:PORT" (insecure)
    with OTLPGrpcReceiver(store).run_in_thread() as receiver:
        ...

Every bad request is answered and the receiver keeps serving: a message over ``max_message``
(as sent, or after gRPC's own gzip inflation) gets ``RESOURCE_EXHAUSTED`` from gRPC itself,
before any of it reaches Python; one over ``limits`` (spans, resource entries, items, found by
a bounded walk before it is decoded) gets ``RESOURCE_EXHAUSTED`` too; a body that is not an
``ExportTraceServiceRequest`` gets ``INVALID_ARGUMENT``; while the decode lane for its size is
full, ``UNAVAILABLE`` (retryable). Decoding runs in a worker thread, never on the loop
(:mod:`._pool`); gRPC's C core reads the bytes. A connection that has not finished the HTTP/2
handshake within ``handshake_timeout`` is closed, as is one idle for ``idle_timeout``, and at
most ``max_concurrent_rpcs`` exports are served at once (the rest get ``RESOURCE_EXHAUSTED``).

The method is registered with a bytes-in handler rather than through the generated
``add_TraceServiceServicer_to_server``: that one parses in gRPC's deserializer, where a corrupt
body becomes ``UNKNOWN`` ("Unexpected DecodeError") instead of ``INVALID_ARGUMENT``. The method
path comes from the generated service descriptor and decoding is
:func:`~latency_analyzer.server.spans.decode_otlp_protobuf`, as for OTLP/HTTP.

``grpcio`` is imported when a receiver is built, so importing this module never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ..errors import UsageError
from ._pool import Busy, DecodePool
from ._runner import Receiver
from .spans import DEFAULT_LIMITS, Limits, PayloadError, PayloadTooLarge, decode_otlp_protobuf
from .store import SpanStore

if TYPE_CHECKING:
    import grpc
    import grpc.aio

__all__ = ["EXPORT_METHOD", "OTLPGrpcReceiver", "import_grpc"]

_SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"]
_EXPORT = _SERVICE.methods_by_name["Export"]
EXPORT_METHOD = f"/{_SERVICE.full_name}/{_EXPORT.name}"
"""``/opentelemetry.proto.collector.trace.v1.TraceService/Export``, from the proto itself."""

_EMPTY_RESPONSE = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
_SHUTDOWN_GRACE_S = 0.5
_INSTALL_HINT = "pip install 'latency-analyzer[grpc]'"


def import_grpc() -> None:
    """Check that grpcio (with ``grpc.aio``) can be imported; the receiver imports it lazily.

    Raises:
        UsageError: grpcio is not installed (the message names the ``grpc`` extra).
    """
    try:
        import grpc.aio  # noqa: F401  (imported to check it imports; the receiver uses it later)
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"the OTLP/gRPC receiver needs grpcio, which is not installed ({exc}); "
            f"install the extra: {_INSTALL_HINT}"
        ) from exc


class OTLPGrpcReceiver(Receiver):
    """Receives OTLP/gRPC trace exports into a :class:`SpanStore`.

    Args:
        store: where decoded spans go.
        host: address to bind; loopback by default (bind another address on purpose only).
        port: 0 picks a free port. A busy port is an error (``SO_REUSEPORT`` is off, so a
            second receiver cannot silently share a port with the first).
        max_message: largest accepted message in bytes, as sent and after gRPC's inflation
            of a compressed message (16 MiB, as ``OTLPHttpReceiver.max_body``).
        limits: spans, resource entries and items per message (:class:`Limits`).
        handshake_timeout: seconds a new connection has to complete the HTTP/2 handshake (10).
        idle_timeout: seconds an idle connection is kept (60).
        max_concurrent_rpcs: exports served at once (64).

    Attributes:
        accepted: export requests stored.
        rejected: export requests answered ``INVALID_ARGUMENT`` or, over ``limits``,
            ``RESOURCE_EXHAUSTED``. Messages over ``max_message`` are refused by gRPC
            before the handler runs and are not counted here.
        busy: export requests answered ``UNAVAILABLE`` (decode lane full).

    Raises:
        UsageError: grpcio is not installed, or ``max_message`` is not positive.
    """

    def __init__(
        self,
        store: SpanStore,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_message: int = 16 * 1024 * 1024,
        limits: Limits = DEFAULT_LIMITS,
        handshake_timeout: float = 10.0,
        idle_timeout: float = 60.0,
        max_concurrent_rpcs: int = 64,
    ) -> None:
        if max_message <= 0:
            raise UsageError(f"max_message must be positive, not {max_message}")
        import_grpc()
        super().__init__(store, host, port, limits)
        self.max_message = max_message
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self._server: grpc.aio.Server | None = None

    @property
    def target(self) -> str:
        """``host:port`` for a gRPC channel (``grpc.aio.insecure_channel(receiver.target)``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def endpoint(self) -> str:
        """The URL exporters take: ``--otlp-traces-endpoint``, ``OTEL_EXPORTER_OTLP_ENDPOINT``.

        The ``http`` scheme tells OpenTelemetry's gRPC exporter to use a plaintext channel.
        """
        return f"http://{self.target}"

    async def start(self) -> None:
        """Bind and serve.

        Raises:
            OSError: the address cannot be bound.
        """
        import grpc.aio

        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message),
                ("grpc.so_reuseport", 0),
                ("grpc.server_handshake_timeout_ms", round(self.handshake_timeout * 1000)),
                ("grpc.max_connection_idle_ms", round(self.idle_timeout * 1000)),
            ],
            maximum_concurrent_rpcs=self.max_concurrent_rpcs,
        )
        handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
            self._export
        )  # bytes in, bytes out
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE.full_name, {_EXPORT.name: handler}),)
        )
        try:
            port = server.add_insecure_port(self.target)
        except RuntimeError as exc:  # grpcio raises where older versions returned 0
            raise OSError(f"cannot bind the OTLP/gRPC receiver to {self.target}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot bind the OTLP/gRPC receiver to {self.target}")
        self._pool = DecodePool()
        await server.start()
        self.port = port  # the real port when port=0
        self._server = server

    async def stop(self) -> None:
        """Stop serving (in-flight exports get half a second to finish)."""
        if self._server is not None:
            await self._server.stop(_SHUTDOWN_GRACE_S)
            self._server = None
        await self._close_pool()

    async def _export(self, body: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        import grpc

        assert self._pool is not None  # serving
        try:
            await self._pool.run(len(body), lambda: self._decode(body))
        except PayloadTooLarge as exc:
            self.rejected += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message)
        except PayloadError as exc:
            self.rejected += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        except Busy as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        self.accepted += 1
        return _EMPTY_RESPONSE  # an empty ExportTraceServiceResponse: full success

    def _decode(self, body: bytes) -> None:
        """In a decode lane: check, decode, store."""
        self.store.add(decode_otlp_protobuf(body, self.limits))
