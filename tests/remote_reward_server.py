"""A reward server of a user's own, written from rlvr's .proto alone: it imports grpc and the
messages `protoc` generates from protos/rlvr/v1/reward.proto into a folder of its own (never the
rlvr package), and implements RewardService.Score for one reward, the way a service in any
language would.

    python remote_reward_server.py GENERATED_DIR PORT MODE

MODE: "exact" (1 when the <answer> block, or the last line, equals the ground truth; a component
"length_ok"), or one of the garbage answers a caller must refuse: "wrong_count" (one score fewer
than asked), "nan", "out_of_range" (1.5), "item_error" (each item's own error). Prints "READY PORT"
once it serves.
"""

import math
import sys
from concurrent import futures

sys.path.insert(0, sys.argv[1])  # the generated rlvr/v1/*_pb2.py, ahead of any installed rlvr

import grpc  # noqa: E402

from rlvr.v1 import common_pb2, reward_pb2, reward_pb2_grpc  # noqa: E402  # generated here, not rlvr's

MODE = sys.argv[3]


def answer(completion: str) -> str:
    close = completion.rfind("</answer>")
    start = completion.rfind("<answer>", 0, max(close, 0))
    if 0 <= start < close:
        return completion[start + len("<answer>"):close].strip()
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class Remote(reward_pb2_grpc.RewardServiceServicer):
    def Score(self, request, context):  # noqa: N802
        results = []
        for item in request.items:
            right = answer(item.completion) == item.ground_truth.strip()
            score = {"exact": 1.0 if right else 0.0, "nan": math.nan, "out_of_range": 1.5}.get(MODE, 1.0)
            result = common_pb2.RewardComponents(reward=score, accuracy=score, extracted_answer=answer(item.completion))
            result.components["length_ok"] = 1.0 if len(item.completion) < 400 else 0.0
            if MODE == "item_error":
                result.error = "the checker could not parse the answer"
            results.append(result)
        if MODE == "wrong_count" and results:
            results.pop()
        return reward_pb2.ScoreResponse(results=results)


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(Remote(), server)
    port = server.add_insecure_port(f"127.0.0.1:{sys.argv[2]}")
    server.start()
    print(f"READY {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
