"""Where a sweep's cells run: the only part of a sweep that differs between executors.

    executor.adapt(job, token) -> job      what this executor needs in each job
    executor.run(jobs, status)  -> (job, outcome) pairs as cells end; `status(str)` now and then
                                   with what each worker is doing (the progress bar's postfix)

    local   this process starts the cells one after another (concurrent cells on one device
            would disturb each other's timings)
    dask    each cell is a Dask task that starts the cell's process (process.run_job) on a
            worker and returns its outcome; one cell per worker at a time (one thread each).
              DaskExecutor(workers=N)          a local cluster: N CPU worker processes, or, when
                                               the cells use CUDA, one worker per visible GPU
                                               (dask-cuda's LocalCUDACluster when importable,
                                               else one Nanny per GPU with its
                                               CUDA_VISIBLE_DEVICES)
              DaskExecutor(scheduler=ADDR)     join a running cluster (address or
                                               scheduler-file path)
              DaskExecutor(client=CLIENT)      any cluster you built (e.g. `slurm_cluster`)

Under Dask the driver still writes every record (runner.py); workers only run cells, in
folders of the shared out dir. A cell sees only its worker's first GPU (CUDA_VISIBLE_DEVICES
pinned), so cells use `device: cuda`. A worker that dies mid-cell makes the scheduler run the
cell again elsewhere (from clean folders); after `distributed.scheduler.allowed-failures`
deaths the cell is recorded failed (KilledWorker). Cells never run twice at once: a cell
process whose driver is gone stops within `process.POLL_S` (lock.driver_alive).
"""
from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..errors import ConfigError
from .process import CellJob, CellOutcome, run_job, run_on_worker

Status = Callable[[str], Any]
logger = logging.getLogger("mtplab.sweep")
# A worker resource: a cell holds one, a worker has one, so the scheduler hands a worker its
# next cell only when the last one ended (balanced, and a dying worker takes only its own).
# mtplab's clusters set it; start your own workers with `--resources cell=1` for the same.
CELL_SLOT = "cell"
CONNECT_TIMEOUT = "30s"      # to reach a running scheduler (--scheduler)


class Executor(Protocol):
    name: str
    dashboard_link: str | None

    def adapt(self, job: CellJob, token: str) -> CellJob: ...

    def run(self, jobs: Sequence[CellJob], status: Status) -> Iterator[tuple[CellJob, CellOutcome]]:
        ...


class LocalExecutor:
    """Cells one after another, children of this process. With a `deadline` (a
    time.monotonic() value) no cell starts that could not end before it (its expected wall:
    the longest cell so far), a cell's timeout is cut to the time left, and the cells not
    started are counted in `not_started` (unrecorded: a later run of the sweep runs them)."""

    name = "local"
    dashboard_link = None

    def __init__(self, deadline: float | None = None):
        self.deadline = deadline
        self.not_started = 0

    def adapt(self, job: CellJob, token: str) -> CellJob:
        return job

    def run(self, jobs: Sequence[CellJob], status: Status) -> Iterator[tuple[CellJob, CellOutcome]]:
        longest = 0.0
        for i, job in enumerate(jobs):
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= longest or left <= 0:
                    self.not_started = len(jobs) - i
                    logger.warning("sweep budget spent: %d cell(s) not started; running the "
                                   "sweep again resumes them", self.not_started)
                    return
                job = replace(job, timeout_s=min(job.timeout_s, left))
            status(f"local: {job.cell_id}")
            t0 = time.monotonic()
            outcome = run_job(job)
            longest = max(longest, time.monotonic() - t0)
            yield job, outcome


class DaskExecutor:
    """Cells as Dask tasks (see the module docstring). A context manager: closing it closes
    the client and the cluster it started (never a cluster it only joined)."""

    name = "dask"

    def __init__(self, *, workers: int | None = None, scheduler: str | None = None,
                 client: Any = None, gpus: Sequence[str] | None = None):
        try:
            from distributed import Client
        except ImportError:
            raise ConfigError("--executor dask needs the `distributed` package: "
                              "pip install 'mtplab[distributed]'.") from None
        if sum(x is not None for x in (scheduler, client)) > 1 or (
                workers is not None and (scheduler or client)):
            raise ConfigError("give one of --workers N (a local cluster) or --scheduler ADDRESS "
                              "(a running cluster).")
        if workers is not None and workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}.")
        self._cluster = None
        self.cluster_kind = "external"
        if client is not None:
            self.client, self._own_client = client, False
            return
        if scheduler is not None:
            path = os.path.expanduser(scheduler)
            try:
                self.client = (Client(scheduler_file=path, timeout=CONNECT_TIMEOUT)
                               if os.path.isfile(path)
                               else Client(scheduler, timeout=CONNECT_TIMEOUT))
            except (OSError, ValueError, TypeError) as e:   # unreachable, or not an address
                raise ConfigError(f"cannot reach the Dask scheduler {scheduler} ({e}); pass "
                                  "tcp://host:port or the path of a scheduler file.") from None
        else:
            self._cluster, self.cluster_kind = local_cluster(workers, list(gpus or []))
            self.client = Client(self._cluster)
        self._own_client = True

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._own_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's URL, None without one (a local scheduler shows it only with bokeh)."""
        services = self.client.scheduler_info(n_workers=0).get("services", {})
        if "dashboard" not in services or (self._cluster is not None
                                           and importlib.util.find_spec("bokeh") is None):
            return None
        return self.client.dashboard_link

    def adapt(self, job: CellJob, token: str) -> CellJob:
        return replace(job, lock_token=token, pin_gpu=True)

    def run(self, jobs: Sequence[CellJob], status: Status) -> Iterator[tuple[CellJob, CellOutcome]]:
        from distributed import as_completed

        futures = {}
        if jobs and not self.client.scheduler_info(n_workers=-1)["workers"]:
            status("waiting for a Dask worker")          # e.g. Slurm jobs still queued
            self.client.wait_for_workers(1)
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        one_each = all(CELL_SLOT in w.get("resources", {}) for w in workers)
        for job in jobs:
            f = self.client.submit(run_on_worker, job, key=f"cell-{job.cell_id}-{job.lock_token}",
                                   pure=False, resources={CELL_SLOT: 1} if one_each else None)
            futures[f.key] = (f, job)
        pending = as_completed([f for f, _ in futures.values()])
        shown = 0.0
        try:
            while not pending.is_empty():
                batch = pending.next_batch(block=False)
                for f in batch:
                    job = futures.pop(f.key)[1]
                    yield job, _outcome(f)
                if not batch:
                    if time.monotonic() - shown > 1.0:
                        status(self.workers_status(set(futures)))
                        shown = time.monotonic()
                    time.sleep(0.1)
        finally:                     # interrupted: drop what did not start; running cells stop
            self.client.cancel([f for f, _ in futures.values()])  # when the lock is released

    def workers_status(self, keys: set[str]) -> str:
        """`<worker>:<cell id>` (or `idle`) for every worker, in name order."""
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        busy = self.client.processing()
        parts = []
        for addr, info in sorted(workers.items(), key=lambda kv: str(kv[1].get("name"))):
            cells = [k.split("-")[1] for k in busy.get(addr, ()) if k in keys]
            parts.append(f"{info.get('name', addr)}:{cells[0][:6] if cells else 'idle'}")
        return " ".join(parts)


def _outcome(f: Any) -> CellOutcome:
    """The task's outcome, or a `lost` one saying why it has none."""
    from distributed import KilledWorker

    try:
        return f.result()
    except KilledWorker:
        lost = ("its Dask worker died each time it ran it (KilledWorker, after "
                "distributed.scheduler.allowed-failures retries); see the workers' logs")
    except Exception as e:       # noqa: BLE001 -- cancelled, or an error outside the cell
        lost = f"the Dask task ended without a result: {type(e).__name__}: {e}"
    return CellOutcome(rc=None, wall_s=math.nan, worker="?", lost=lost)


def local_cluster(workers: int | None, gpus: list[str]) -> tuple[Any, str]:
    """A cluster on this host: one single-thread worker process per GPU in `gpus` (at most
    `workers`), or `workers` CPU worker processes (default: one per core) when `gpus` is empty.
    Returns (cluster, a name for its kind)."""
    from distributed import LocalCluster

    if not gpus:
        n = cpu_workers(workers)
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                               resources={CELL_SLOT: 1}, dashboard_address=":0")
        return cluster, "LocalCluster"
    n = workers or len(gpus)
    if n > len(gpus):
        raise ConfigError(f"--workers {n} exceeds the {len(gpus)} visible GPUs (one worker "
                          "per GPU); lower --workers or set CUDA_VISIBLE_DEVICES.")
    try:
        from dask_cuda import LocalCUDACluster
    except Exception as e:       # noqa: BLE001 -- absent, or unusable with this CUDA stack
        if not isinstance(e, ImportError):
            logger.warning("dask-cuda is installed but fails to import (%s: %s); starting one "
                           "Nanny per GPU instead.", type(e).__name__, e)
        LocalCUDACluster = None
    if LocalCUDACluster is not None:
        cluster = LocalCUDACluster(n_workers=n, CUDA_VISIBLE_DEVICES=gpus[:n],
                                   threads_per_worker=1, resources={CELL_SLOT: 1},
                                   dashboard_address=":0")
        return cluster, "LocalCUDACluster"
    from distributed import Nanny, Scheduler, SpecCluster

    spec = {i: {"cls": Nanny, "options": {"nthreads": 1, "resources": {CELL_SLOT: 1},
                                          "env": {"CUDA_VISIBLE_DEVICES": g}}}
            for i, g in enumerate(gpus[:n])}
    return SpecCluster(workers=spec, scheduler={"cls": Scheduler, "options": {
        "dashboard_address": ":0"}}), "SpecCluster (a Nanny per GPU)"


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                  # not Linux
        return os.cpu_count() or 1


def cell_threads() -> int:
    """The torch threads of one CPU cell on a local Dask worker: the OMP_NUM_THREADS its process
    gets. process.run_job passes the worker's environment on (1 where it has none), and Dask's
    Nanny sets the worker's from `distributed.nanny.pre-spawn-environ` (1 by default)."""
    import dask
    import distributed  # noqa: F401 -- its config defaults load with it

    pre = dask.config.get("distributed.nanny.pre-spawn-environ", None) or {}
    value = pre.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", 1))
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def cpu_workers(workers: int | None) -> int:
    """How many CPU workers a local cluster starts (default: one per usable core). Concurrent
    CPU cells share the cores with each other and with the sweep's own processes (this driver,
    the Dask scheduler, nannies and workers): once two or more workers' cells need every core
    (workers x torch threads per cell >= cores) their tok/s is not that of a cell alone, so
    that is allowed with a one-line warning naming the fix."""
    cores, threads = usable_cores(), cell_threads()
    n = workers or cores
    if n > 1 and n * threads >= cores:
        fit = max(1, (cores - 1) // threads)
        fix = f"--workers {fit}" + (" (or --executor local)" if fit == 1 else "")
        if threads > 1:
            fix += (", or fewer torch threads per cell (OMP_NUM_THREADS in "
                    "distributed.nanny.pre-spawn-environ)")
        logger.warning("mtplab sweep: %d Dask CPU workers x %d torch thread(s) per cell on %d "
                       "cores leave no core to the sweep's own processes: cells running at once "
                       "slow each other, so their tok/s and latencies are lower than alone; for "
                       "timings use %s.", n, threads, cores, fix)
    return n


def visible_gpus() -> list[str]:
    """The GPU ids this process may use (CUDA_VISIBLE_DEVICES order), [] without CUDA."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in env.split(",") if d.strip()] if env else [str(i) for i in range(n)]
    return ids[:n]


def slurm_cluster(*, partition: str, walltime: str = "04:00:00", memory: str = "64GB",
                  cores: int = 8, gpus_per_job: int = 1, account: str | None = None,
                  python: str | None = None, **kwargs: Any) -> Any:
    """A dask-jobqueue SLURMCluster shaped for sweeps: each Slurm job is one single-thread
    worker (one cell at a time) with `cores` CPUs for the cell's process and `gpus_per_job`
    GPUs (use 1: a cell sees its worker's first GPU only).
    `cluster.scale(jobs=N)` then asks Slurm for N such jobs. docs/sweeps.md has the recipe."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise ConfigError("a Slurm cluster needs dask-jobqueue: "
                          "pip install 'mtplab[distributed]'.") from None
    extra = [f"--gres=gpu:{gpus_per_job}"] if gpus_per_job else []
    return SLURMCluster(queue=partition, account=account, walltime=walltime, memory=memory,
                        cores=1, processes=1, job_cpu=cores, python=python,
                        worker_extra_args=["--resources", f"{CELL_SLOT}=1"],
                        job_extra_directives=extra + list(kwargs.pop("job_extra_directives", [])),
                        **kwargs)
