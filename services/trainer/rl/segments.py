"""Per-sequence reductions over (rows, tokens) tensors that may hold packed sequences."""

from __future__ import annotations

import torch


def default_segments(mask: torch.Tensor) -> torch.Tensor:
    """Segment ids when every row is one sequence: row index on every position."""
    rows = torch.arange(mask.shape[0], device=mask.device).unsqueeze(-1)
    return rows.expand_as(mask)


def segment_sums(
    values: torch.Tensor, mask: torch.Tensor, segment_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ_t m·v, Σ_t m)`` per sequence, for the sequences that have at least one masked-in token.

    ``segment_ids`` gives each token's sequence index (≥ 0; padding −1, which must carry mask 0). Returns two
    1-D tensors of the same length; differentiable in ``values``.
    """
    seg = default_segments(mask) if segment_ids is None else segment_ids
    keep = (mask > 0) & (seg >= 0)
    ids = seg[keep].long()
    if ids.numel() == 0:
        empty = values.new_zeros(0)
        return empty, empty
    # Renumber the present ids densely so sequences without trained tokens vanish.
    uniq, dense = torch.unique(ids, return_inverse=True)
    sums = values.new_zeros(uniq.shape[0]).index_add(0, dense, values[keep] * mask[keep].to(values.dtype))
    counts = values.new_zeros(uniq.shape[0]).index_add(0, dense, mask[keep].to(values.dtype))
    return sums, counts


def broadcast_segments(
    per_seq: torch.Tensor, mask: torch.Tensor, segment_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse of ``segment_sums``' grouping: each masked-in token gets its sequence's value; others 0."""
    seg = default_segments(mask) if segment_ids is None else segment_ids
    keep = (mask > 0) & (seg >= 0)
    out = per_seq.new_zeros(mask.shape)
    ids = seg[keep].long()
    if ids.numel():
        _, dense = torch.unique(ids, return_inverse=True)
        out[keep] = per_seq[dense]
    return out
