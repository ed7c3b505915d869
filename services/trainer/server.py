"""gRPC glue of the trainer service.

Until the issue that builds this service lands, its RPCs answer UNIMPLEMENTED (the generated base
servicer); health, reflection and graceful shutdown already work.
"""

from rlvr.common.server import GrpcService
from rlvr.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer.settings import TrainerSettings


def build_service(settings: TrainerSettings) -> GrpcService:
    name = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name
    servicer = trainer_pb2_grpc.TrainerServiceServicer()
    return GrpcService([(trainer_pb2_grpc.add_TrainerServiceServicer_to_server, servicer, name)])
