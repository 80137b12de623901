"""``lightning-tune-data prepare``: tokenize a config's sources into their stores, without training.

    lightning-tune-data prepare --config cfg.yaml                          # every task here, one process
    lightning-tune-data prepare --config cfg.yaml --engine local --workers 4
    lightning-tune-data prepare --config cfg.yaml --task-index 3 --num-tasks 64
    sbatch --array=0-63 examples/prepare_slurm_array.sh cfg.yaml           # SLURM_ARRAY_TASK_ID/COUNT
    torchrun --nproc_per_node 8 -m lightning_tune_data prepare --config cfg.yaml   # RANK/WORLD_SIZE
    lightning-tune-data prepare --config cfg.yaml --finalize

Which task this process runs comes from ``--task-index``/``--num-tasks``, else a Slurm job array's
environment, else torchrun's, else it runs every task itself (``--engine local``). The last task
to finish commits each store; ``--finalize`` commits whatever finished (and names what did not).
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TaskProcessError", "main", "task_from_environment", "with_overrides"]


def task_from_environment(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(task_index, num_tasks)`` from a Slurm job array or torchrun, ``None`` outside both.

    torchrun inside a job array runs task ``array_index x world_size + rank`` of
    ``array_count x world_size``: every rank of every array element does its own share.

    Args:
        environ: The environment (default ``os.environ``).

    Raises:
        ValueError: The variables name a task that does not exist.
    """
    env = os.environ if environ is None else environ
    array = torchrun = None
    try:
        if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
            first = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
            step = max(1, int(env.get("SLURM_ARRAY_TASK_STEP") or "1"))  # --array=0-63:4 numbers tasks 0, 4, ...
            array = (int(env["SLURM_ARRAY_TASK_ID"]) - first) // step, int(env["SLURM_ARRAY_TASK_COUNT"])
        if "RANK" in env and "WORLD_SIZE" in env:
            torchrun = int(env["RANK"]), int(env["WORLD_SIZE"])
    except ValueError as error:
        raise ValueError(f"cannot tell this process's task from the Slurm/torchrun environment ({error}); "
                         f"pass --task-index and --num-tasks.") from None
    for found, names in ((array, "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"), (torchrun, "RANK/WORLD_SIZE")):
        if found is not None and not 0 <= found[0] < found[1]:
            raise ValueError(f"{names} give task {found[0]} of {found[1]}, which does not exist; "
                             f"pass --task-index and --num-tasks.")
    if array is not None and torchrun is not None:
        # torchrun inside a job array: each array element runs world_size ranks, each its own task
        (index, count), (rank, world) = array, torchrun
        return index * world + rank, count * world
    return array or torchrun


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-tune-data prepare",
        description="Tokenize every source of a fit config into its store (local or s3://, gs://, ...) without "
                    "training, split into tasks any scheduler can run.",
    )
    parser.add_argument("--config", required=True, help="a `lightning-tune-data fit` YAML config (its data: section)")
    parser.add_argument("--task-index", type=int, default=None, help="the task this process runs (0-based)")
    parser.add_argument("--num-tasks", type=int, default=None,
                        help="how many tasks split the work (the same for every task of a store)")
    parser.add_argument("--engine", choices=["local"], default=None,
                        help="run the tasks here: --workers processes take --num-tasks tasks (default: one each)")
    parser.add_argument("--workers", type=int, default=1, help="processes of the local engine (default 1)")
    parser.add_argument("--finalize", action="store_true",
                        help="only commit the stores whose tasks all finished; name the unfinished tasks")
    parser.add_argument("--repair", action="store_true",
                        help="verify every file of the committed stores; redo only the tasks whose files fail, "
                             "then commit again (other stores are not touched)")
    parser.add_argument("--cache-dir", default=None, help="override data.cache_dir of the config")
    return parser


def _run_task(arguments: tuple[str | dict[str, Any], int, int, str | None]) -> dict[str, str]:
    from lightning_tune_data.datamodule.store_tasks import prepare_task

    config, index, count, cache_dir = arguments
    return prepare_task(config, index, count, cache_dir=cache_dir)


class TaskProcessError(RuntimeError):
    """A worker process of the local engine died (killed, out of memory) before its task finished."""


def _task_process(job: tuple[str, int, int, str | None], connection: Any) -> None:
    """Run one task in a worker process and send back its result or its error.

    The worker shows no progress bars of its own: the bars of several workers would overwrite each
    other on one line; the parent prints one line per finished task instead.
    """
    import datasets

    datasets.disable_progress_bars()
    try:
        reply: tuple[str, Any] = ("done", _run_task(job))
    except BaseException as error:  # noqa: BLE001 - sent to the parent, which raises it
        try:
            pickle.dumps(error)
            reply = ("error", error)
        except Exception:  # noqa: BLE001 - an exception that does not pickle is sent as its text
            reply = ("error", RuntimeError(f"{type(error).__name__}: {error}"))
    connection.send(reply)
    connection.close()


def _died(process: Any) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        hint = ", e.g. by the out-of-memory killer" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {code} without a result"


def with_overrides(config: str, overrides: list[str]) -> str | dict[str, Any]:
    """The config at ``config`` with ``--data.<key> VALUE`` / ``--data.<key>=VALUE`` applied, as
    ``fit`` accepts them (values are YAML: ``--data.shard_size 64MB``, ``--data.seed 3``); the path
    itself when there are none.

    Args:
        config: The YAML config's path.
        overrides: The command-line arguments ``prepare`` does not know itself.

    Raises:
        ValueError: An argument that is not a ``--data.*`` override, or one without a value.
    """
    if not overrides:
        return config
    import yaml

    loaded = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
    position = 0
    while position < len(overrides):
        argument = overrides[position]
        if not argument.startswith("--data."):
            raise ValueError(f"unrecognized argument {argument!r}: prepare takes its own options (see --help) and "
                             f"--data.<key> VALUE overrides of the config, as fit does.")
        if "=" in argument:
            key, value = argument[2:].split("=", 1)
        elif position + 1 < len(overrides):
            key, value = argument[2:], overrides[position + 1]
            position += 1
        else:
            raise ValueError(f"{argument} needs a value (e.g. {argument} VALUE).")
        node = loaded
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--{key}: {part} is not a mapping in {config}.")
        node[last] = yaml.safe_load(value)
        position += 1
    return loaded


def _local_engine(config: str | dict[str, Any], num_tasks: int, workers: int, cache_dir: str | None,
                  label: str | None = None) -> None:
    """Run every task here, ``workers`` at a time, one forked process per task.

    A worker that dies (SIGKILL, the out-of-memory killer) is noticed at once: the other workers
    are stopped and :class:`TaskProcessError` names the task (its rerun redoes only that task and
    the ones stopped). A task's error is raised here as it was raised there.
    """
    jobs = [(config, index, num_tasks, cache_dir) for index in range(num_tasks)]
    if workers <= 1:
        for job in jobs:
            _report(job[1], num_tasks, _run_task(job))
        return
    context = _pool_context()
    pending, running = list(jobs), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                job = pending.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_task_process, args=(job, send))  # may fork (num_proc)
                process.start()
                send.close()
                running[process.sentinel] = (process, job[1], receive)
            for sentinel in multiprocessing.connection.wait(list(running)):
                process, index, receive = running.pop(sentinel)
                try:
                    reply = receive.recv() if receive.poll() else None
                except EOFError:  # the pipe closed without a reply: the process died
                    reply = None
                process.join()
                if reply is None:
                    raise TaskProcessError(
                        f"task {index} of {num_tasks}: its worker process {_died(process)}. Nothing it wrote is "
                        f"used; rerun it (lightning-tune-data prepare --config {label or config} --task-index {index} "
                        f"--num-tasks {num_tasks}) or rerun the local engine, which skips the finished tasks."
                    )
                if reply[0] == "error":
                    raise reply[1]
                _report(index, num_tasks, reply[1])
    finally:
        for process, _, _ in running.values():
            process.terminate()
        for process, _, _ in running.values():
            process.join()


def _pool_context() -> multiprocessing.context.BaseContext:
    """``fork`` on Linux, else ``spawn``.

    A spawned worker imports the package again (torch, lightning, datasets: ~5 s of CPU each, before
    it tokenizes anything), which on 2 cores cancelled most of the gain of a second worker. A forked
    one inherits the parent's imports. The parent has only imported modules by then (no tokenizer
    used, no store opened, no loader started), as before the DataLoader forks its workers.
    """
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _report(index: int, num_tasks: int, result: Mapping[str, str]) -> None:
    for source, status in result.items():
        print(f"task {index} of {num_tasks}: {source}: {status}")


def main(argv: list[str]) -> int:
    """Parse ``argv`` and prepare; returns the exit code.

    Args:
        argv: The command's arguments (without the program and command names).

    Returns:
        0 when the tasks ran (or the stores were committed), 1 when ``--finalize`` found
        unfinished tasks, 2 when the config, the data or the storage is unusable (printed).
    """
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    from lightning_tune_data.cache.tasks import StoreNotCommittedError
    from lightning_tune_data.datamodule.store_tasks import finalize_stores

    label = args.config
    try:
        args.config = with_overrides(args.config, extra)
        if args.repair:
            from lightning_tune_data.datamodule.store_tasks import repair_stores

            for source, status in repair_stores(args.config, cache_dir=args.cache_dir).items():
                print(f"{source}: {status}")
            return 0
        if args.finalize:
            for source, status in finalize_stores(args.config, cache_dir=args.cache_dir).items():
                print(f"{source}: {status}")
            return 0
        chosen = (args.task_index, args.num_tasks) if args.task_index is not None else None
        if chosen is not None and args.num_tasks is None:
            raise ValueError("--task-index needs --num-tasks")
        if chosen is None and args.engine is None:
            chosen = task_from_environment()
        if chosen is None:
            num_tasks = args.num_tasks or max(1, args.workers)
            _local_engine(args.config, num_tasks, max(1, args.workers), args.cache_dir, label)
        else:
            _report(chosen[0], chosen[1], _run_task((args.config, chosen[0], chosen[1], args.cache_dir)))
    except StoreNotCommittedError as error:
        print(f"lightning-tune-data prepare: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError, RuntimeError) as error:
        print(f"lightning-tune-data prepare: {error}", file=sys.stderr)
        return 2
    return 0
