"""A gRPC client that knows nothing of rlvr: it lists a server's services through server
reflection, resolves each one's methods from the descriptors reflection sends, and asks the
standard health service for each service's status. Standard libraries only (grpcio,
grpcio-reflection, grpcio-health-checking); run as `python tests/tools/grpc_probe.py HOST:PORT`.
Exit code 0 when every service lists and reports SERVING."""

from __future__ import annotations

import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase


def probe(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(database)
        health = health_pb2_grpc.HealthStub(channel)
        ok = True
        for name in database.get_services():
            methods = [m.name for m in pool.FindServiceByName(name).methods]
            try:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(
                    health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status)
            except grpc.RpcError as e:
                status = e.code().name
            print(f"{name} {status} {len(methods)} methods: {', '.join(methods)}")
            ok &= status == "SERVING" or name.startswith("grpc.")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(probe(sys.argv[1]))
