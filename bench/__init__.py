"""The benchmarks: one module per question, run as ``python -m bench.<name>`` from the repository root.

Each drives the stack through ``launcher``'s public API (or a service's own CLI) and writes
``bench/results/<name>.md``; modules named ``_*.py`` are their parts (reports, arms, helpers), never run alone.
bench/README.md lists them: the question each answers, its command, its time and its latest result.
"""
