"""Benchmarks and paper reproductions of the three methods (``daskann bench ...``).

Apart from the methods they measure: no method and no planner module imports
this package; the command line imports its modules when a benchmark runs.
Shared pieces: :mod:`._machine` (the machine a report was measured on) and
:mod:`._report` (JSON and plots); the GEMM probe is the product's own
(:mod:`daskann._gemm`), so the benchmarks' bound and the cost model measure alike.
"""
