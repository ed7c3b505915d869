"""The trainer's process layer: how a job runs as processes, knowing nothing of GRPO.

`worker.JobSupervisor` (what the gRPC servicer calls) owns at most one job process at a time and
follows it through its files; `job_process` is that process's entry point, which runs the job
(services/trainer/job/) and reports its result; `forkserver` forks job processes from a process that
has imported the job's libraries once; `launch` gives torchrun's arguments for a job of several
processes or nodes; `publisher` takes the job's events to NATS from its synchronous loop.
"""
