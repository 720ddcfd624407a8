"""The Kafka wire-protocol gateway: unmodified Kafka clients produce to and consume from RobustMQ.

``robustmq kafka-gateway --port 9092 --meta HOST:PORT`` runs :func:`run_gateway`;
:class:`Gateway` is the asyncio server (``_server``), whose dispatch table
(``_protocol.ApiTable``) each part fills: ``_metadata`` (ApiVersions,
Metadata, CreateTopics, DeleteTopics), ``_produce`` (Produce,
InitProducerId), ``_fetch`` (Fetch, ListOffsets). Records convert between
Kafka's RecordBatch v2 and the Arrow record schema in ``_records``.
See docs/kafka.md.
"""

from ._server import BROKER_ID, Connection, Gateway, GatewaySettings, GatewayThread, run_gateway

__all__ = ["BROKER_ID", "Connection", "Gateway", "GatewaySettings", "GatewayThread", "run_gateway"]
