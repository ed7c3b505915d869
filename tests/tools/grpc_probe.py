"""A gRPC client that knows nothing of rlvr: for each address it lists the server's services through
server reflection, resolves each one's methods from the descriptors reflection sends, and asks the
standard health service for each service's status. Standard libraries only (grpcio,
grpcio-reflection, grpcio-health-checking); run as `python tests/tools/grpc_probe.py HOST:PORT ...`.
Prints one line per service, then `serving N/M` (the addresses whose every service is SERVING);
exit code 0 when all are."""

from __future__ import annotations

import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase


def probe(address: str) -> bool:
    """Whether every service `address` lists through reflection reports SERVING."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(database)
        health = health_pb2_grpc.HealthStub(channel)
        ok = True
        try:
            names = list(database.get_services())
        except grpc.RpcError as e:
            print(f"{address} unreachable: {e.code().name}")
            return False
        for name in names:
            methods = [m.name for m in pool.FindServiceByName(name).methods]
            try:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(
                    health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status)
            except grpc.RpcError as e:
                status = e.code().name
            print(f"{address} {name} {status} {len(methods)} methods: {', '.join(methods)}")
            ok &= status == "SERVING" or name.startswith("grpc.")
        return ok


def main(addresses: list[str]) -> int:
    serving = sum(probe(address) for address in addresses)
    print(f"serving {serving}/{len(addresses)}")
    return 0 if serving == len(addresses) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
