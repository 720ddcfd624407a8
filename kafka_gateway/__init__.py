"""The Kafka wire-protocol gateway: unmodified Kafka clients produce to and consume from RobustMQ.

``robustmq kafka-gateway --port 9092 --meta HOST:PORT`` runs :func:`run_gateway`;
:class:`Gateway` is the asyncio server (``_server``), whose dispatch table
(``_protocol.ApiTable``) each part fills: ``_metadata`` (ApiVersions,
Metadata, CreateTopics, DeleteTopics), ``_produce`` (Produce,
InitProducerId), ``_fetch`` (Fetch, ListOffsets), ``_groups`` (the consumer
group coordinator and committed offsets; ``_peers`` picks each group's
coordinator among several gateways), ``_sasl`` (TLS, SASL and the principals'
clients; :class:`Security`). :class:`GatewayThread` serves a gateway
inside another process (``robustmq server --kafka-port``). Records convert between
Kafka's RecordBatch v2 and the Arrow record schema in ``_records``.
See docs/kafka.md.
"""

from ._sasl import Security
from ._server import BROKER_ID, Connection, Gateway, GatewaySettings, GatewayThread, run_gateway

__all__ = [
    "BROKER_ID",
    "Connection",
    "Gateway",
    "GatewaySettings",
    "GatewayThread",
    "Security",
    "run_gateway",
]
