"""The communication libraries behind one small interface: MPI, torch.distributed gloo/NCCL.

A :class:`Comm` is what the measuring loop (:mod:`.run`) needs and nothing
more: buffers filled with this rank's contribution, a blocking AllReduce that
has *completed on this rank* when it returns (NCCL: the stream synchronised),
a count of wrong result elements, and small object collectives for the
bookkeeping (gather, broadcast, barrier) that run outside the timed region.

Each backend is launched the way it is in production, and the launcher tells
the process its rank: ``mpirun -np N`` (Open MPI sets ``OMPI_COMM_WORLD_*``;
a process started alone is a one-rank MPI world) and ``torchrun
--nproc-per-node N`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...). The
libraries are optional (``tailgate[mpi]``, ``tailgate[torch]``): a missing one,
or NCCL without a GPU, is a :class:`BackendUnavailable` naming what to do.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import numpy as np

from .pattern import PERIOD, count_wrong
from .spec import DType

BACKENDS = ("mpi", "gloo", "nccl")
_INT_SENTINEL = -(2**30)  # never a correct int32 result: reductions here stay tiny


class BackendUnavailable(Exception):
    """The backend cannot run here (library missing, no GPU, not launched): exit 2."""


def boot_id() -> str:
    """This kernel's boot id: processes sharing it share CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return f"unknown-{socket.gethostname()}-{os.getpid()}"


class Comm:
    """The interface the loop uses (see the module docstring)."""

    backend = ""
    rank = 0
    size = 1
    library = ""
    placements: tuple[str, ...] = ("out_of_place",)

    def buffers(self, count: int, dtype: DType, row: np.ndarray, placement: str) -> tuple[Any, Any]:
        raise NotImplementedError

    def reset(self, send: Any, recv: Any, placement: str) -> None:
        """Before each iteration, outside the timed region: a stale result must not pass."""
        raise NotImplementedError

    def allreduce(self, send: Any, recv: Any, op: str, placement: str) -> None:
        raise NotImplementedError

    def wrong(self, recv: Any, expected: np.ndarray) -> int:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def gather(self, obj: Any) -> list[Any] | None:
        raise NotImplementedError

    def bcast(self, obj: Any) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def abort(self, code: int) -> None:
        """End every rank now (a run past its time limit); never returns."""
        os._exit(code)


# -- MPI (mpi4py) -------------------------------------------------------------------------


class MpiComm(Comm):
    backend = "mpi"
    placements = ("out_of_place", "in_place")

    def __init__(self) -> None:
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise BackendUnavailable(
                f"--backend mpi needs mpi4py ({exc}): pip install 'tailgate[mpi]' "
                "(builds against an MPI such as Debian's openmpi-bin libopenmpi-dev)") from None
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def buffers(self, count, dtype, row, placement):
        if dtype.numpy is None:
            raise BackendUnavailable(f"--backend mpi has no {dtype.name} (no such MPI datatype "
                                     "in Open MPI 4.1); use float32, float64 or int32")
        send = np.resize(row.astype(dtype.numpy), count)
        recv = np.empty(count, dtype=dtype.numpy)
        return send, recv

    def reset(self, send, recv, placement):
        if placement == "in_place":
            np.copyto(recv, send)
        else:
            recv.fill(np.nan if recv.dtype.kind == "f" else _INT_SENTINEL)

    def allreduce(self, send, recv, op, placement):
        src = self.MPI.IN_PLACE if placement == "in_place" else send
        self.comm.Allreduce(src, recv, op=self._ops[op])

    def wrong(self, recv, expected):
        return count_wrong(recv, expected.astype(recv.dtype))

    def barrier(self):
        self.comm.Barrier()

    def gather(self, obj):
        return self.comm.gather(obj, root=0)

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0)

    def abort(self, code):
        self.comm.Abort(code)
        os._exit(code)


# -- torch.distributed (gloo on CPU, NCCL on GPUs) ------------------------------------------


class TorchComm(Comm):
    placements = ("in_place",)  # torch.distributed.all_reduce reduces in place

    def __init__(self, backend: str, timeout_s: float) -> None:
        try:
            import torch
            import torch.distributed as dist
        except ImportError as exc:
            raise BackendUnavailable(f"--backend {backend} needs torch ({exc}): "
                                     "pip install 'tailgate[torch]'") from None
        if backend == "nccl" and not torch.cuda.is_available():
            raise BackendUnavailable(
                "--backend nccl needs an NVIDIA GPU: torch.cuda.is_available() is False "
                f"here (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]
        if missing:
            raise BackendUnavailable(
                f"--backend {backend} must be launched by torchrun (no {', '.join(missing)} "
                f"in the environment): torchrun --nproc-per-node N -m tailgate bench allreduce "
                f"--backend {backend} ...")
        self.torch, self.dist = torch, dist
        self.backend = backend
        if backend == "nccl":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        import datetime

        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.library = f"torch {torch.__version__} {backend}"
        if backend == "nccl":
            self.library += " NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
        R = dist.ReduceOp
        self._ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX}

    def _dtype(self, dtype: DType) -> Any:
        return getattr(self.torch, dtype.name)

    def buffers(self, count, dtype, row, placement):
        t = self.torch
        base = t.tensor(row, dtype=self._dtype(dtype), device=self.device)
        send = base.repeat((count + PERIOD - 1) // PERIOD)[:count].contiguous()
        return send, t.empty_like(send)

    def reset(self, send, recv, placement):
        recv.copy_(send)

    def allreduce(self, send, recv, op, placement):
        self.dist.all_reduce(recv, op=self._ops[op])
        if self.device.type == "cuda":  # NCCL returns once enqueued: time the completion
            self.torch.cuda.synchronize(self.device)

    def wrong(self, recv, expected):
        t = self.torch
        row = t.tensor(expected, dtype=recv.dtype, device=recv.device)
        n = recv.shape[0]
        full = n - n % PERIOD
        bad = int((recv[:full].view(-1, PERIOD) != row).sum().item())
        if full < n:
            bad += int((recv[full:] != row[: n - full]).sum().item())
        return bad

    def barrier(self):
        self.dist.barrier()

    def gather(self, obj):
        out: list[Any] | None = [None] * self.size if self.rank == 0 else None
        self.dist.gather_object(obj, out, dst=0)
        return out

    def bcast(self, obj):
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self):
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def connect(backend: str, timeout_s: float = 300.0) -> Comm:
    """Join the job this process was launched into, with ``backend``."""
    if backend == "mpi":
        return MpiComm()
    if backend in ("gloo", "nccl"):
        return TorchComm(backend, timeout_s)
    raise BackendUnavailable(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
