"""Micro-batches for training: several sequences packed into one row without attention across them
(``pack``), one per padded row (``pad``), or a group's samples sharing what they begin with (``pack_shared``).

A packed row holds sequences back to back; each restarts its position ids at 0. With no 2-D attention mask,
transformers (≥ 5) reads the restarts in ``position_ids`` and builds a block-diagonal causal mask, so a
token attends only to earlier tokens of its own sequence (``tests/unit/trainer/test_packing.py`` proves
packed logprobs equal unpacked ones). The padded layout (one sequence per row, right padding and an
attention mask) is kept as the baseline the benchmark compares against.

Every per-token quantity of a sequence is stored at the position that *predicts* the token: token ``i + 1``
is predicted from position ``i``, so ``targets[i] = tokens[i + 1]`` and the masks/fields shift with it.

Shared prefixes: samples that begin alike share one copy of what they have in common. A GRPO group is n samples of one prompt, and on multi-turn tasks they often stay alike well past it: samples
that issue the same first search get the same documents back (on 2Wiki most of a ~550-token sample is the
prompt, one search and its observation). Packed one by one, that common part goes through the model n times
with the same result. Here a group becomes a prefix tree: each node holds the positions its sequences share
(same tokens before and after, so the same input and the same target), laid out once in a row; a 4-D mask
lets a position see the earlier positions of its own node and of its ancestors only.

Trained positions may sit inside a shared node (a search every sample wrote alike), and each sample has its own
advantage and sampler logprob there. So the loss is not read off the row's positions but off *slots*, one per
(sample, trained position), each naming the row position that computes its log-probability (``Slots``).
``loss_view`` gathers the forward's per-position values into slot order; backward sums the gradients of every
slot of a position through it: the gradient of n separate copies, from one forward
(``tests/unit/trainer/test_prefix_tree.py`` checks it against the plain layout).
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
    # Where positions are shared by several samples (``pack_shared``, below): the loss's entries, each a
    # (sample, trained position) with its own values; ``loss_view`` reads them. None: one per position.
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


def empty_batch(field_names: list[str]) -> MicroBatch:
    """A one-token batch with nothing to train: keeps ranks in step when one has fewer micro-batches."""
    return _batch(
        [[TrainSeq(tokens=[0], mask=[0], fields={k: [0.0] for k in field_names}, index=-1)]],
        1,
        field_names,
        packed=True,
    )


# ---------------------------------------------------------------- shared prefixes (a prefix tree per group)
@dataclass
class _Node:
    """Positions ``[lo, hi)`` shared by ``seqs`` (their tokens agree from 0 to ``hi``), and what follows."""

    lo: int
    hi: int
    seqs: list[TrainSeq]
    children: list[_Node] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.hi - self.lo + sum(c.size for c in self.children)


def _tree(seqs: list[TrainSeq], lo: int) -> _Node:
    """The prefix tree of ``seqs``, which agree on tokens ``0..lo`` (so they share positions before ``lo``).

    Position ``i`` reads token ``i`` and predicts token ``i + 1``: two sequences share it when both tokens
    (and so everything before) agree. A sequence's last position predicts nothing and is never shared.
    """
    if len(seqs) == 1:
        return _Node(lo, len(seqs[0].tokens), seqs)
    hi = lo
    while all(len(s.tokens) > hi + 1 for s in seqs) and len({s.tokens[hi + 1] for s in seqs}) == 1:
        hi += 1
    node = _Node(lo, hi, seqs)
    parts: dict[int, list[TrainSeq]] = {}
    for s in seqs:
        # Sequences ending at ``hi`` (their last position predicts nothing) continue alone.
        key = s.tokens[hi + 1] if len(s.tokens) > hi + 1 else -1 - s.index
        parts.setdefault(key, []).append(s)
    node.children = [_tree(part, hi) for part in parts.values()]
    return node


def _prompt(s: TrainSeq) -> int:
    """Tokens before the one that predicts the sample's first trained token: its prompt, minus the last token."""
    first = s.mask.index(1) if 1 in s.mask else len(s.tokens)
    return max(first - 1, 0)


def _shared_positions(a: list[int], b: list[int]) -> int:
    """Positions two sequences share in a tree: those whose token and next token agree in both."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return max(n - 1, 0)


def _roots(seqs: list[TrainSeq], cap: int, min_prefix: int) -> list[_Node]:
    """Trees of at most ``cap`` tokens, one per prompt (samples whose prompts of ``min_prefix`` or more tokens are
    equal: a GRPO group); a group too large for ``cap`` is split, in sample order, each part with its own copy
    of what it shares. Keyed by prompt, not by a trie of the whole step, so that building stays linear in the
    number of groups (a GPU step holds hundreds of samples) and quadratic only within one."""
    groups: dict[tuple[int, ...], list[TrainSeq]] = {}
    for s in seqs:
        n = _prompt(s)
        key = tuple(s.tokens[: n + 1]) if n >= min_prefix else (-1 - s.index,)
        groups.setdefault(key, []).append(s)
    roots: list[_Node] = []
    for members in groups.values():
        part: list[TrainSeq] = []
        size = 0
        for s in sorted(members, key=lambda s: s.index):
            # What the tree grows by: the sample, less what it shares with the one it shares most with.
            grows = len(s.tokens) - max((_shared_positions(s.tokens, m.tokens) for m in part), default=0)
            if part and size + grows > cap:
                roots.append(_tree(part, 0))
                part, size, grows = [], 0, len(s.tokens)
            part.append(s)
            size += grows
        roots.append(_tree(part, 0))
    return roots


def _layout(roots: list[_Node], length: int) -> tuple[dict[str, list], torch.Tensor, list[tuple[int, TrainSeq, int]]]:
    """One row holding ``roots`` depth-first, padded to ``length``: its columns, its ``[length, length]``
    attention (a column sees earlier columns of its own node and of the node's ancestors), and one slot
    ``(column, sample, token)`` per trained token of every sample."""
    row: dict[str, list] = {k: [] for k in ("input_ids", "position_ids", "targets", "target_mask", "seq")}
    node_of: list[int] = []
    lineage: list[set[int]] = []
    slots: list[tuple[int, TrainSeq, int]] = []

    def put(node: _Node, parents: set[int]) -> None:
        me = len(lineage)
        lineage.append(parents | {me})
        first = node.seqs[0]
        start = len(row["input_ids"])
        for i in range(node.lo, node.hi):
            last = i + 1 >= len(first.tokens)
            trained = [s for s in node.seqs if not last and s.mask[i + 1]]
            row["input_ids"].append(first.tokens[i])
            row["position_ids"].append(i)
            row["targets"].append(0 if last else first.tokens[i + 1])
            row["target_mask"].append(1 if trained else 0)
            row["seq"].append(first.index)
            node_of.append(me)
            slots.extend((start + i - node.lo, s, i + 1) for s in trained)
        for child in node.children:
            put(child, lineage[me])

    for root in roots:
        put(root, set())
    extra = pad_row(row, length, [])
    pad_node = len(lineage)
    lineage.append({pad_node})  # padding: a causal block of its own
    node_of += [pad_node] * extra
    mask = torch.tensor([[k in lineage[q] for k in range(len(lineage))] for q in range(len(lineage))])
    nodes = torch.tensor(node_of)
    visible = mask[nodes][:, nodes] & torch.ones(length, length, dtype=torch.bool).tril()
    return row, visible, slots


def pack_shared(seqs: list[TrainSeq], token_budget: int, min_prefix: int = 8) -> list[MicroBatch]:
    """Packed micro-batches in which samples of one prompt share everything they have in common (see above).

    Values at a batch's positions are only meaningful where ``target_mask`` is 1 and are the first sample's
    there; the loss reads ``loss_view``. ``logprobs.unpack`` (all positions of every sequence) needs ``pack``.
    """
    if not seqs:
        return []
    field_names = sorted(seqs[0].fields)
    longest = longest_within(seqs, token_budget)
    roots = _roots(seqs, max(token_budget, longest), min_prefix)
    # A row is as long as the largest tree (or sequence), no longer: attention on CPU computes the whole
    # row × row square, masked or not, so rows stay as short as the units they must hold.
    cap = max(t.size for t in roots)
    ordered = sorted(roots, key=lambda t: (-t.size, t.seqs[0].index))
    rows, used = fill_rows(ordered, [t.size for t in ordered], cap)
    return [_micro_batch([rows[j] for j in g], used[g[0]], field_names) for g in row_groups(used, token_budget)]


def _micro_batch(rows: list[list[_Node]], length: int, field_names: list[str]) -> MicroBatch:
    built = [_layout(r, length) for r in rows]
    col = {k: torch.tensor([b[0][k] for b in built]) for k in built[0][0]}
    index, seq, values = [], [], {name: [] for name in field_names}
    for r, (_, _, slots) in enumerate(built):
        for column, s, t in slots:
            index.append(r * length + column)
            seq.append(s.index)
            for name in field_names:
                values[name].append(s.fields[name][t])
    return MicroBatch(
        input_ids=col["input_ids"].long(),
        position_ids=col["position_ids"].long(),
        attention_mask=torch.stack([b[1] for b in built]).unsqueeze(1),
        targets=col["targets"].long(),
        target_mask=col["target_mask"].float(),
        seq=col["seq"].long(),
        fields={},
        slots=Slots(
            index=torch.tensor(index, dtype=torch.long),
            mask=torch.ones(len(index)),
            seq=torch.tensor(seq, dtype=torch.long),
            fields={k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()},
        ),
    )


def loss_view(
    batch: MicroBatch, logp: torch.Tensor, entropy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, MicroBatch]:
    """``(logp, entropy, batch)`` in the layout the loss reads: unchanged for a plain batch; for a tree batch
    one row of slots, each with its own sample's mask, sequence and fields (per-position fields the trainer
    attached, such as the reference logprobs, are gathered to the slots too)."""
    slots = batch.slots
    if slots is None:
        return logp, entropy, batch
    idx = slots.index.to(logp.device)

    def at(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1)[idx.to(t.device)].unsqueeze(0)

    fields = {k: v.unsqueeze(0) for k, v in slots.fields.items()}
    fields |= {k: at(v) for k, v in batch.fields.items() if k not in fields}
    view = MicroBatch(
        input_ids=at(batch.input_ids),
        position_ids=at(batch.position_ids),
        attention_mask=None,
        targets=at(batch.targets),
        target_mask=slots.mask.unsqueeze(0),
        seq=slots.seq.unsqueeze(0),
        fields=fields,
    )
    return at(logp), at(entropy), view
