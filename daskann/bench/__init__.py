"""Benchmarks and paper reproductions of the three methods (``daskann bench ...``).

Apart from the methods they measure: no method and no planner module imports
this package; the command line imports its modules when a benchmark runs.
Shared pieces: :mod:`._report` (the machine a report was measured on); the
GEMM probe is the product's own (:mod:`daskann._blas`), so the benchmarks'
bound and the cost model measure alike.
"""
