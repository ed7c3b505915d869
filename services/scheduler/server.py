"""gRPC glue of the scheduler service.

Until the issue that builds this service lands, its RPCs answer UNIMPLEMENTED (the generated base
servicer); health, reflection and graceful shutdown already work.
"""

from rlvr.common.server import GrpcService
from rlvr.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.scheduler.settings import SchedulerSettings


def build_service(settings: SchedulerSettings) -> GrpcService:
    name = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
    servicer = scheduler_pb2_grpc.SchedulerServiceServicer()
    return GrpcService([(scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server, servicer, name)])
