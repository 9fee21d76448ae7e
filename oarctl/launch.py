"""Old home of the launch code, kept for one release: stages under `accelerate launch` and the persistent
update worker now live in oarctl/processes/launch.py, the GPU hand-off in oarctl/processes/gpus.py."""
from oarctl.processes.gpus import (READY_FILE, announce_ready, gpus_free_file, release_cuda_cache,  # noqa: F401
                                   rest_generation_engines, wait_for_gpus)  # re-export for one release: oarctl.processes.gpus
from oarctl.processes.launch import (Launched, Pending, UpdateWorker, WorkerRequest, accelerate_config,  # noqa: F401
                                     launch_stage, rank_dies_with_launcher, stage_command, start_stage,
                                     stop_update_worker, terminate_with_parent, update_command,
                                     update_worker)  # re-export for one release: oarctl.processes.launch
