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
before any of it reaches Python; a body that is not an ``ExportTraceServiceRequest`` gets
``INVALID_ARGUMENT``.

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
from ._runner import ThreadRunner
from .spans import PayloadError, decode_otlp_protobuf
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
        import grpc.aio  # noqa: F401
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"the OTLP/gRPC receiver needs grpcio, which is not installed ({exc}); "
            f"install the extra: {_INSTALL_HINT}"
        ) from exc


class OTLPGrpcReceiver:
    """Receives OTLP/gRPC trace exports into a :class:`SpanStore`.

    Args:
        store: where decoded spans go.
        host: address to bind; loopback by default (bind another address on purpose only).
        port: 0 picks a free port. A busy port is an error (``SO_REUSEPORT`` is off, so a
            second receiver cannot silently share a port with the first).
        max_message: largest accepted message in bytes, as sent and after gRPC's inflation
            of a compressed message (16 MiB, as ``OTLPHttpReceiver.max_body``).

    Attributes:
        accepted: export requests stored.
        rejected: export requests answered ``INVALID_ARGUMENT``. Oversized messages are
            refused by gRPC before the handler runs and are not counted here.

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
    ) -> None:
        if max_message <= 0:
            raise UsageError(f"max_message must be positive, not {max_message}")
        import_grpc()
        self.store = store
        self.host = host
        self.port = port
        self.max_message = max_message
        self.accepted = 0
        self.rejected = 0
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
            ]
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
        await server.start()
        self.port = port  # the real port when port=0
        self._server = server

    async def stop(self) -> None:
        """Stop serving (in-flight exports get half a second to finish)."""
        if self._server is not None:
            await self._server.stop(_SHUTDOWN_GRACE_S)
            self._server = None

    async def __aenter__(self) -> OTLPGrpcReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def run_in_thread(self) -> ThreadRunner[OTLPGrpcReceiver]:
        """A sync context manager serving on a private loop in a daemon thread."""
        return ThreadRunner(self)

    async def _export(self, body: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        import grpc

        try:
            spans = decode_otlp_protobuf(body)
        except PayloadError as exc:
            self.rejected += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        self.store.add(spans)
        self.accepted += 1
        return _EMPTY_RESPONSE  # an empty ExportTraceServiceResponse: full success
