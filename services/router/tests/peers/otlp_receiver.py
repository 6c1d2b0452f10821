"""An OTLP receiver for the tests, built on the official OpenTelemetry
protocol definitions (opentelemetry-proto): it takes
ExportTraceServiceRequest and ExportMetricsServiceRequest over OTLP/HTTP
(POST /v1/traces and /v1/metrics, protobuf, gzip too) and over OTLP/gRPC
(TraceService/Export, MetricsService/Export), and keeps every span and
every histogram data point.

  GET /spans    every span received so far, as JSON: ids in hex, name, kind,
                attributes, status, times (ns), resource attributes, and
                which protocol brought it ("http" or "grpc")
  GET /metrics  every histogram data point received so far: the metric's
                name, unit and temporality, the point's attributes, count,
                sum, bounds and bucket counts, resource attributes, "via"
  GET /info     {"grpc": "127.0.0.1:PORT"}

Both listen on 127.0.0.1, ports of their own choosing; it prints
"otlp receiver listening on http://ADDR/" (the HTTP one).
"""

import gzip
import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

spans = []
points = []
lock = threading.Lock()


def value_of(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return getattr(v, kind)


def keep(request, via):
    with lock:
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append({
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": s.kind,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": {a.key: value_of(a.value) for a in s.attributes},
                        "status": {"code": s.status.code, "message": s.status.message},
                        "resource": resource,
                        "via": via,
                    })


def keep_metrics(request, via):
    with lock:
        for resource_metrics in request.resource_metrics:
            resource = {a.key: value_of(a.value) for a in resource_metrics.resource.attributes}
            for scope_metrics in resource_metrics.scope_metrics:
                for m in scope_metrics.metrics:
                    if m.WhichOneof("data") != "histogram":
                        continue
                    for p in m.histogram.data_points:
                        points.append({
                            "name": m.name,
                            "unit": m.unit,
                            "temporality": m.histogram.aggregation_temporality,
                            "attributes": {a.key: value_of(a.value) for a in p.attributes},
                            "count": p.count,
                            "sum": p.sum,
                            "bounds": list(p.explicit_bounds),
                            "bucket_counts": list(p.bucket_counts),
                            "start": p.start_time_unix_nano,
                            "time": p.time_unix_nano,
                            "resource": resource,
                            "via": via,
                        })


class MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):
        keep_metrics(request, "grpc")
        return metrics_service_pb2.ExportMetricsServiceResponse()


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        keep(request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), grpc_server)
metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(), grpc_server)
grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
grpc_server.start()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/spans":
            with lock:
                body = json.dumps(spans).encode()
            return self.reply(200, body, "application/json")
        if self.path == "/metrics":
            with lock:
                body = json.dumps(points).encode()
            return self.reply(200, body, "application/json")
        if self.path == "/info":
            return self.reply(200, json.dumps({"grpc": f"127.0.0.1:{grpc_port}"}).encode(), "application/json")
        self.reply(404, b"not found", "text/plain")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path not in ("/v1/traces", "/v1/metrics"):
            return self.reply(404, b"not found", "text/plain")
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.headers.get("content-type") != "application/x-protobuf":
            return self.reply(415, b"protobuf only", "text/plain")
        if self.path == "/v1/metrics":
            request = metrics_service_pb2.ExportMetricsServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception as e:
                return self.reply(400, str(e).encode(), "text/plain")
            keep_metrics(request, "http")
            response = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            return self.reply(200, response, "application/x-protobuf")
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as e:  # a malformed body: the exporter's fault
            return self.reply(400, str(e).encode(), "text/plain")
        keep(request, "http")
        self.reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"otlp receiver listening on http://127.0.0.1:{server.server_address[1]}/", flush=True)
sys.stdout.flush()
server.serve_forever()
