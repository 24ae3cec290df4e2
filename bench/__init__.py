"""The benchmarks: each module is run from the repository root as ``python -m bench.<name>``.

They import each other as ``bench.<module>``, the product as ``model_agent`` and the test bed as ``testbed``;
running them as modules of this package from the root puts all three on the path, so no script edits
``sys.path``. Reports, results and what each benchmark measures: docs/performance.md.
"""
