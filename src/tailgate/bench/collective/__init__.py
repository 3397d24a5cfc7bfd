"""Collective-communication benchmarks: ``tailgate bench allreduce`` and nccl-tests evidence.

Every step of data-parallel training or tensor-parallel inference waits for
the slowest rank of its AllReduce; nccl-tests prints one average per message
size, so the tail that stalls a step is invisible. This package measures each
iteration as the slowest rank saw it and keeps the distribution.

* :mod:`.spec`     sizes, dtypes, ops, nccl-tests' bandwidth formulas (pure)
* :mod:`.pattern`  what each rank contributes and what the result must be (pure)
* :mod:`.analyze`  per-rank timestamps -> per-size result: histogram, bandwidth, straggler (pure)
* :mod:`.backends` MPI (mpi4py) and torch.distributed (gloo, NCCL) behind one small interface
* :mod:`.run`      the loop every rank runs
* :mod:`.nccl_tests` nccl-tests ``*_perf`` output parsed into the same document (pure)
* :mod:`.result`   the document: SLOs per size, warnings, exit status, HdrHistogram log
* :mod:`.command`  ``tailgate bench allreduce`` options and the run (its terminal table and
  HTML page: :mod:`tailgate.report.collective_render`)
"""
