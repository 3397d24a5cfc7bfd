"""``tailgate bench allreduce`` with one rank's contribution corrupted: a fault, injected.

Run under a launcher in place of ``-m tailgate`` (``mpirun -np 2 python
allreduce_corrupt.py bench allreduce --backend mpi ...``). Rank 1 adds 1 to
element 3 of its send buffer, once, before the measured loop: the real
collective then carries a wrong contribution, as a faulty rank or fabric would,
and every rank's result is wrong in exactly that element at every iteration.
"""

import sys

from tailgate.bench.collective import backends
from tailgate.cli import main


def corrupt(cls: type) -> None:
    original = cls.buffers

    def buffers(self, count, dtype, row, placement):
        send, recv = original(self, count, dtype, row, placement)
        if self.rank == 1:
            send[3] += 1
        return send, recv

    cls.buffers = buffers


corrupt(backends.MpiComm)
corrupt(backends.TorchComm)
sys.exit(main(sys.argv[1:]))
