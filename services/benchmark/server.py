"""gRPC glue of the benchmark service.

Until the issue that builds this service lands, its RPCs answer UNIMPLEMENTED (the generated base
servicer); health, reflection and graceful shutdown already work.
"""

from rlvr.common.server import GrpcService
from rlvr.v1 import benchmark_pb2, benchmark_pb2_grpc
from services.benchmark.settings import BenchmarkSettings


def build_service(settings: BenchmarkSettings) -> GrpcService:
    name = benchmark_pb2.DESCRIPTOR.services_by_name["BenchmarkService"].full_name
    servicer = benchmark_pb2_grpc.BenchmarkServiceServicer()
    return GrpcService([(benchmark_pb2_grpc.add_BenchmarkServiceServicer_to_server, servicer, name)])
