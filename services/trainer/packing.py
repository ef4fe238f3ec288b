"""Micro-batches for training: pack several sequences into one row without attention across them.

A packed row holds sequences back to back; each restarts its position ids at 0. With no 2-D attention mask,
transformers (≥ 5) reads the restarts in ``position_ids`` and builds a block-diagonal causal mask, so a
token attends only to earlier tokens of its own sequence (``tests/unit/trainer/test_packing.py`` proves
packed logprobs equal unpacked ones). The padded layout (one sequence per row, right padding and an
attention mask) is kept as the baseline the benchmark compares against.

Every per-token quantity of a sequence is stored at the position that *predicts* the token: token ``i + 1``
is predicted from position ``i``, so ``targets[i] = tokens[i + 1]`` and the masks/fields shift with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class TrainSeq:
    """One sequence to train on, with per-token values aligned to ``tokens`` (as in a ``Sample``)."""

    tokens: list[int]
    mask: list[int]  # 1 where the token is trained
    fields: dict[str, list[float]] = field(default_factory=dict)  # per-token extras (sampler logprobs, …)
    index: int = 0  # position in the step's list, to map results back


@dataclass
class Slots:
    """One entry per (sample, trained position): ``index`` is the flat position (row × length + column) that
    computes it; ``mask``, ``seq`` and ``fields`` are that sample's values there."""

    index: torch.Tensor
    mask: torch.Tensor
    seq: torch.Tensor
    fields: dict[str, torch.Tensor]


@dataclass
class MicroBatch:
    """Tensors of one forward pass; ``[rows, length]`` each. ``seq`` is -1 on padding."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None  # None for packed rows (block-diagonal mask from position ids)
    targets: torch.Tensor
    target_mask: torch.Tensor  # float: 1 where targets[i] is a trained token
    seq: torch.Tensor  # which TrainSeq.index each position belongs to
    fields: dict[str, torch.Tensor]
    # Where positions are shared by several samples (``prefix_tree.pack_shared``): the loss's entries, each a
    # (sample, trained position) with its own values; ``prefix_tree.loss_view`` reads them. None: one per position.
    slots: Slots | None = None

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens: what tokens/s counts."""
        return int((self.seq >= 0).sum())

    @property
    def num_slots(self) -> int:
        return self.input_ids.numel()


def _row(seqs: list[TrainSeq], length: int, field_names: list[str]) -> dict[str, list]:
    """One row of ``length`` slots holding ``seqs`` back to back, padded at the end."""
    row = {"input_ids": [], "position_ids": [], "targets": [], "target_mask": [], "seq": []}
    row.update({name: [] for name in field_names})
    for s in seqs:
        n = len(s.tokens)
        row["input_ids"] += s.tokens
        row["position_ids"] += list(range(n))
        row["targets"] += [*s.tokens[1:], 0]
        row["target_mask"] += [*s.mask[1:], 0]
        row["seq"] += [s.index] * n
        for name in field_names:
            row[name] += [*s.fields[name][1:], 0.0]
    pad_row(row, length, field_names)
    return row


def pad_row(row: dict[str, list], length: int, field_names: list[str]) -> int:
    """Fill ``row`` up to ``length`` slots; returns how many were added. Padding restarts its positions at 0,
    so in a packed row it forms a block of its own; it is never trained."""
    pad = length - len(row["input_ids"])
    row["input_ids"] += [0] * pad
    row["position_ids"] += list(range(pad))
    row["targets"] += [0] * pad
    row["target_mask"] += [0] * pad
    row["seq"] += [-1] * pad
    for name in field_names:
        row[name] += [0.0] * pad
    return pad


def _batch(rows: list[list[TrainSeq]], length: int, field_names: list[str], packed: bool) -> MicroBatch:
    built = [_row(r, length, field_names) for r in rows]
    col = {k: [b[k] for b in built] for k in built[0]}
    seq = torch.tensor(col["seq"], dtype=torch.long)
    return MicroBatch(
        input_ids=torch.tensor(col["input_ids"], dtype=torch.long),
        position_ids=torch.tensor(col["position_ids"], dtype=torch.long),
        attention_mask=None if packed else (seq >= 0).long(),
        targets=torch.tensor(col["targets"], dtype=torch.long),
        target_mask=torch.tensor(col["target_mask"], dtype=torch.float32),
        seq=seq,
        fields={k: torch.tensor(col[k], dtype=torch.float32) for k in field_names},
    )


def pack(seqs: list[TrainSeq], token_budget: int, row_tokens: int | None = None) -> list[MicroBatch]:
    """Packed micro-batches: sequences first-fit-decreasing into rows, rows grouped up to ``token_budget`` slots.

    A row holds at most ``row_tokens`` tokens (default: the longest sequence, capped by the budget), so no
    row is longer than an unpacked one would be: attention, which is quadratic in the row length wherever
    no variable-length kernel exists (CPU), costs no more than with padding, while the padding itself is
    gone. A sequence longer than the budget gets a row and a micro-batch of its own (and a warning): it is
    never truncated.
    """
    if not seqs:
        return []
    field_names = sorted(seqs[0].fields)
    longest = longest_within(seqs, token_budget)
    cap = min(row_tokens or longest, token_budget)
    ordered = sorted(seqs, key=lambda s: (-len(s.tokens), s.index))
    rows, used = fill_rows(ordered, [len(s.tokens) for s in ordered], cap)
    return [_batch([rows[j] for j in g], used[g[0]], field_names, packed=True) for g in row_groups(used, token_budget)]


def longest_within(seqs: list[TrainSeq], token_budget: int) -> int:
    """The longest sequence's length, with a warning when it exceeds the budget (it is never truncated)."""
    longest = max(len(s.tokens) for s in seqs)
    if longest > token_budget:
        log.warning("sequence longer than the micro-batch budget", extra={"tokens": longest, "budget": token_budget})
    return longest


def fill_rows(units: list, sizes: list[int], cap: int) -> tuple[list[list], list[int]]:
    """``units`` (in the order given, largest first for first-fit decreasing) into rows of at most ``cap``
    tokens, each into the first row it fits; returns the rows and their lengths."""
    rows: list[list] = []
    used: list[int] = []
    for unit, n in zip(units, sizes, strict=True):
        for i, u in enumerate(used):
            if u + n <= cap:
                rows[i].append(unit)
                used[i] += n
                break
        else:
            rows.append([unit])
            used.append(n)
    return rows, used


def row_groups(used: list[int], token_budget: int) -> list[list[int]]:
    """Rows (by index) grouped into micro-batches, longest row first so that a group's first row sets its padded
    length; a group takes rows while ``rows × that length`` stays within ``token_budget``."""
    groups: list[list[int]] = []
    for i in sorted(range(len(used)), key=lambda i: -used[i]):
        if groups and used[groups[-1][0]] * (len(groups[-1]) + 1) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def pad(seqs: list[TrainSeq], token_budget: int) -> list[MicroBatch]:
    """The plain layout: sequences in arrival order, one per row, right-padded to the longest of the batch.

    Rows are added while ``rows × longest`` stays within ``token_budget``.
    """
    if not seqs:
        return []
    field_names = sorted(seqs[0].fields)
    batches: list[MicroBatch] = []
    current: list[TrainSeq] = []
    for s in seqs:
        longest = max([len(s.tokens)] + [len(c.tokens) for c in current])
        if current and longest * (len(current) + 1) > token_budget:
            batches.append(_padded(current, field_names))
            current = []
        current.append(s)
    batches.append(_padded(current, field_names))
    return batches


def _padded(seqs: list[TrainSeq], field_names: list[str]) -> MicroBatch:
    length = max(len(s.tokens) for s in seqs)
    return _batch([[s] for s in seqs], length, field_names, packed=False)


def unpack(values: torch.Tensor, batch: MicroBatch, out: dict[int, list[float]]) -> None:
    """Scatter per-position ``values`` back to per-sequence lists aligned with the tokens.

    ``out[index][t]`` is the value for token ``t`` (token 0 has none: it stays 0.0).
    """
    flat_seq = batch.seq.reshape(-1).tolist()
    flat_val = values.detach().reshape(-1).tolist()
    flat_pos = batch.position_ids.reshape(-1).tolist()
    seen: set[int] = set()
    for s, v, p in zip(flat_seq, flat_val, flat_pos, strict=True):
        if s < 0:
            continue
        seen.add(s)
        row = out.setdefault(s, [0.0])
        if len(row) == p + 1:
            row.append(v)
    for s in seen:
        del out[s][-1:]  # the last position of a sequence predicts nothing


def empty_batch(field_names: list[str]) -> MicroBatch:
    """A one-token batch with nothing to train: keeps ranks in step when one has fewer micro-batches."""
    return _batch(
        [[TrainSeq(tokens=[0], mask=[0], fields={k: [0.0] for k in field_names}, index=-1)]],
        1,
        field_names,
        packed=True,
    )
